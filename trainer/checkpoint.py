"""Checkpoints that resume a run exactly.

A checkpoint is one directory ``RUN_DIR/checkpoints/step_000025/`` holding

* the policy in Hugging Face format (``config.json``, ``model.safetensors``, tokenizer files), so
  ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads it directly;
* ``trainer_state.pt``: optimizer and scheduler state, the Python/NumPy/torch RNG states, the step,
  the policy version, the RL seconds so far and, in ``extra``, the store cursor (which batches the
  learner has consumed) -- the rollout schedule is a pure function of the step, so no episode
  counter is needed;
* ``rollout_weights/v<N>.safetensors``: the older policy versions that episodes still in flight
  were (or will be) sampled with. Bounded-staleness training samples batch ``k`` with version
  ``k - max_policy_lag``, so resuming exactly needs those few older versions too.

Writes are atomic: everything goes into ``.tmp-step_…`` first, is fsynced and then renamed, and
``RUN_DIR/checkpoints/LATEST`` names the newest complete checkpoint. A crash while saving leaves
the previous checkpoint untouched.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fr_agents.run_layout import (
    CHECKPOINT_GLOB,
    LATEST,
    STATE_FILE,
    checkpoint_name,
    checkpoint_root,
    latest_checkpoint,
)

if TYPE_CHECKING:
    from fr_agents.tree import TrajectoryTree
    from trainer.parts import LearnerSide
    from trainer.types import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """Everything besides weights and optimizer that an exact resume needs."""

    step: int = 0  # optimizer steps taken
    version: int = 0  # policy version (== step: one version per optimizer step)
    rl_elapsed_s: float = 0.0  # seconds of RL so far (resumed runs included): trainer.max_minutes
    warm_start: dict[str, Any] = field(default_factory=dict)
    baseline_reward: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """The state of every random generator the trainer touches."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_dir(path: Path) -> None:
    for p in [*path.rglob("*"), path]:
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: str | Path,
    *,
    model: torch.nn.Module,
    tokenizer: Tokenizer | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    state: TrainerState,
    rollout_weights: dict[int, dict[str, torch.Tensor]] | None = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint for ``state.step`` atomically and prune older ones (``keep`` newest)."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(state.step)
    final = root / name
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if rollout_weights:
        wdir = tmp / "rollout_weights"
        wdir.mkdir()
        for version, sd in rollout_weights.items():
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in sd.items()}, wdir / f"v{version}.safetensors"
            )
    torch.save(
        {
            "trainer": asdict(state),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": capture_rng(),
        },
        tmp / STATE_FILE,
    )
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer_tmp = root / f".{LATEST}.tmp"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / LATEST)
    _prune(root, keep)
    log.info("checkpoint saved: %s", final)
    return final


def _prune(root: Path, keep: int) -> None:
    """Keep the ``keep`` newest complete checkpoints, and always ``step_000000`` (the start of RL,
    after any warm start), so that "before RL" can be evaluated later."""
    done = sorted(
        p for p in root.glob(CHECKPOINT_GLOB) if (p / STATE_FILE).exists() and p.name != checkpoint_name(0)
    )
    for old in done[: max(0, len(done) - max(1, keep))]:
        shutil.rmtree(old, ignore_errors=True)


def load_rollout_weights(path: str | Path) -> dict[int, dict[str, torch.Tensor]]:
    """The older policy versions saved next to a checkpoint, by version."""
    wdir = Path(path) / "rollout_weights"
    out: dict[int, dict[str, torch.Tensor]] = {}
    for f in sorted(wdir.glob("v*.safetensors")):
        out[int(f.stem[1:])] = load_file(f)
    return out


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load only the model weights of checkpoint ``path`` into ``model`` (in place)."""
    path = Path(path)
    weights = path / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"checkpoint {path} has no model.safetensors")
    missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
    # Tied embeddings are saved once; anything else missing is a real mismatch.
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing={real_missing} unexpected={unexpected}"
        )


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    restore_rngs: bool = True,
) -> TrainerState:
    """Load weights, optimizer, scheduler and RNG from checkpoint ``path``; return its state."""
    path = Path(path)
    load_weights(path, model)
    blob = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    configured = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs) if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) else None
    optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    _keep_configured_hyperparameters(optimizer, scheduler, configured, base_lrs)
    if restore_rngs:
        restore_rng(blob["rng"])
    known = {f.name for f in fields(TrainerState)}  # checkpoints of older versions carried unused fields
    return TrainerState(**{k: v for k, v in blob["trainer"].items() if k in known})


def _keep_configured_hyperparameters(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    configured: list[dict[str, Any]],
    base_lrs: list[float] | None,
) -> None:
    """Give ``optimizer`` back the settings the run's config built it with (``optim.lr``, betas,
    weight decay), which ``load_state_dict`` replaced by the checkpoint's: ``fr-agents train --resume
    RUN optim.lr=...`` changes the rate from the resumed step on. The moments, the step counts and
    the schedule's position stay the checkpoint's."""
    changed: list[str] = []
    for i, (group, mine) in enumerate(zip(optimizer.param_groups, configured, strict=True)):
        base = base_lrs[i] if base_lrs is not None else mine["lr"]
        saved_base = group.get("initial_lr", group["lr"])
        if saved_base != base:
            changed.append(f"lr {saved_base:g} -> {base:g}")
        for key, value in mine.items():
            if key in ("lr", "initial_lr"):
                continue
            if key in group and group[key] != value:
                changed.append(f"{key} {group[key]} -> {value}")
            group[key] = value
        if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            group["initial_lr"] = base
            group["lr"] = base * scheduler.lr_lambdas[i](scheduler.last_epoch)
        else:
            group["lr"] = base
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) and base_lrs is not None:
        scheduler.base_lrs = list(base_lrs)
    if changed:
        settings = ", ".join(sorted(set(changed)))
        log.info("resume: the config's optimizer settings replace the checkpoint's: %s", settings)


# =========================================================================== a run's checkpoints


def checkpoint_run(
    run_dir: str | Path,
    side: LearnerSide,
    state: TrainerState,
    *,
    tree: TrajectoryTree,
    lag: int,
    lag_histogram: dict[str, int],
    keep: int,
) -> Path:
    """Save the learner side ``side`` (:class:`trainer.parts.LearnerSide`) at ``state``: its
    version, the store cursor of ``tree``, the lag histogram, and the weight versions the next
    ``lag`` batches still sample with (from ``side.board``)."""
    state.version = side.learner.version
    tree.sync()  # the loop marks batches consumed without an fsync; the cursor saved here is on disk
    state.extra["store_cursor"] = tree.cursor()
    state.extra["lag_histogram"] = lag_histogram
    if side.learner.spike is not None:  # the spike clip's norm history: a resumed run clips as this one would
        state.extra["spike_clip"] = side.learner.spike.state_dict()
    needed = range(max(0, state.step - lag), state.step)
    older = {v: w for v in needed if (w := side.board.get(v)) is not None}
    return save_checkpoint(
        run_dir,
        model=side.model,
        tokenizer=side.tokenizer,
        optimizer=side.learner.optimizer,
        scheduler=side.learner.scheduler,
        state=state,
        rollout_weights=older,
        keep=keep,
    )


def resume_run(run_dir: str | Path, side: LearnerSide, *, tree: TrajectoryTree) -> tuple[TrainerState, Path]:
    """Restore ``run_dir``'s latest checkpoint into the learner side ``side``: weights, optimizer,
    scheduler, RNGs, the learner's version, the weight board; rewind ``tree`` to the saved cursor
    and cut the metrics back to the saved step. Returns the state and the checkpoint's path."""
    from fr_agents.config import ConfigError
    from trainer.metrics import truncate_metrics

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"--resume: {run_dir} has no complete checkpoint")
    learner = side.learner
    state = load_checkpoint(ckpt, model=side.model, optimizer=learner.optimizer, scheduler=learner.scheduler)
    learner.version = state.version
    if learner.spike is not None and "spike_clip" in state.extra:
        learner.spike.load_state_dict(state.extra["spike_clip"])
    tree.rewind(int(state.extra.get("store_cursor", state.step)))
    truncate_metrics(run_dir, state.step)
    side.metrics.reopen()
    for v, w in load_rollout_weights(ckpt).items():
        side.board.publish(v, w)
    return state, ckpt
