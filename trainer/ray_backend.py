"""``trainer.backend=ray``: rollout workers and the learner as Ray actors.

The same schedule, ledger and tree as the embedded loop (:mod:`trainer.loop`), spread over
processes (and, after ``ray start``, machines)::

    driver                         LearnerActor (num_cpus / num_gpus)      RolloutWorker x W (num_cpus=1)
    ──────                         ─────────────────────────────────      ────────────────────────────
    launch batches s..s+lag ──────────────────────────────────────────►  run(specs, weights[v], v)
    for k: wait batch k            step(k): Trainer.learn -- export      set weights if v changed,
           learner.step(k) ──────► batch k, one optimizer step, metrics, run episodes -> tree + ledger
           launch batch k+1+lag    guards, checkpoint; new weights ───►  (episodes already in the
                                   (object store)                        ledger are kept, not rerun)

Weight sync goes through the Ray object store: ``LearnerActor.step`` returns the new CPU state
dict as an object ref; batch ``k+1+lag`` is launched with that ref as its argument, so Ray
starts it as soon as the weights exist and every worker on a node reads the same shared copy.
Staleness is the embedded loop's: batch ``k`` is sampled with version ``k - max_policy_lag``.

Between two batches the learner runs the embedded loop's own step (:meth:`Trainer.learn`), so a
Ray run has the same metrics, evaluations, non-finite-loss and collapse guards, and checkpoints
every ``trainer.checkpoint_every`` steps. ``fr-agents train --resume RUN_DIR`` continues a Ray
run that crashed (driver, actors or the whole local Ray) from its latest checkpoint: the store
is rewound to the checkpoint's cursor, the weights the in-flight batches sample with come from
the checkpoint, and every episode the ledger acknowledged is kept rather than run again.

The tree and ledger are SQLite files in the run directory, written by every worker (WAL mode);
on a multi-node cluster the run directory must be on a shared filesystem.

GPUs (documented, untested here): give the learner ``num_gpus=1`` per training GPU and each
rollout worker ``num_gpus=1``; replace the object-store hop by an NCCL broadcast -- create a
``torch.distributed`` group (``backend="nccl"``) spanning the learner rank 0 and every worker,
``dist.broadcast(param, src=0)`` each parameter into the workers' engine buffers after each step
(``ray.util.collective`` offers the same over NCCL). That path needs GPUs and is not exercised by
the tests. Elastic pools are not supported with this backend yet (the embedded loop has them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fr_agents.config import ConfigError, TrainConfig, leaves_per_tree
from trainer.loop import TrainResult

if TYPE_CHECKING:
    from trainer.loop import Trainer

log = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ConfigError("trainer.backend=ray: ray is not installed (pip install 'ray[default]')") from e
    return ray


def _trainer(cfg: TrainConfig, run_dir: str) -> Trainer:
    logging.basicConfig(level=os.environ.get("FR_AGENTS_LOG", "WARNING"))
    from trainer.loop import Trainer

    return Trainer(cfg, run_dir, console=False)


PACKAGES = ("fr_agents", "envs", "tools_sandbox", "trainer")
"""The top-level packages of fr-agents (what a worker process must be able to import)."""


def _install_kind() -> str:
    """``"regular"`` (pip install .), ``"editable"`` (pip install -e) or ``"none"`` (a bare checkout)."""
    import json
    from importlib import metadata

    try:
        dist = metadata.distribution("fr-agents")
    except metadata.PackageNotFoundError:
        return "none"
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            if json.loads(direct).get("dir_info", {}).get("editable"):
                return "editable"
        except ValueError:
            pass
    return "regular"


def runtime_env(*, remote: bool, install: str | None = None) -> dict[str, Any]:
    """The Ray ``runtime_env`` of a run: one torch/OpenMP thread per actor, and the package shipped
    to the workers when they cannot import it themselves.

    An installed package (``pip install .``) is imported by workers from their own environment, as
    Ray expects; an editable install is too on this machine. Ray ships the package source
    (``py_modules``) when it is not installed at all, or when an editable install meets a remote
    cluster (``RAY_ADDRESS``) whose nodes do not hold this checkout.
    """
    import importlib

    install = install or _install_kind()
    env: dict[str, Any] = {"env_vars": {"OMP_NUM_THREADS": "1"}}
    if install == "none" or (remote and install == "editable"):
        env["py_modules"] = [str(Path(importlib.import_module(p).__file__).parent) for p in PACKAGES]
    return env


def rollout_worker_resources(cfg: TrainConfig) -> dict[str, Any]:
    """What one rollout worker asks Ray for: the worker holds one engine (one policy copy) and
    no learner, so one CPU, plus one GPU only when its engine runs on CUDA."""
    gpu = cfg.trainer.device.startswith("cuda")
    return {"num_cpus": 1, "num_gpus": 1 if gpu else 0}


class LearnerCore:
    """The learner side: the embedded trainer's learner, run step by step by the driver.

    Everything between two batches is the embedded loop's own code (:meth:`Trainer.learn`): the
    optimizer step, metrics, evaluations, the non-finite-loss and collapse guards, and a
    checkpoint every ``trainer.checkpoint_every`` steps (with the older weights that the batches
    still in flight sample with), so ``--resume`` continues a Ray run exactly as an embedded one.
    """

    def __init__(self, cfg: TrainConfig, run_dir: str) -> None:
        self.trainer = _trainer(cfg, run_dir)

    def setup(self, resume: bool) -> tuple[int, float]:
        """Restore the latest checkpoint (``resume``) or evaluate and warm start; returns the first
        step to run and the RL seconds already spent."""
        self.state, self.evals = self.trainer.open_run(resume)
        return self.state.step, self.state.rl_elapsed_s

    def num_tasks(self) -> int:
        return len(self.trainer.rollout_side.rl_tasks)

    def weights(self, version: int) -> dict[str, torch.Tensor]:
        """Version ``version``'s weights (CPU), while a batch may still sample with it."""
        w = self.trainer.board.get(version)
        if w is None:
            raise KeyError(
                f"policy version {version} is no longer kept (current {self.trainer.learner.version})"
            )
        return w

    def step(self, k: int) -> tuple[dict[str, Any], str | None, dict[str, torch.Tensor] | None, bool]:
        """Step ``k``: the metrics row, why the run must stop (or None), the new weights (None when
        stopping), and whether the run has reached its plateau (``trainer.plateau_patience``)."""
        failed = self.trainer.learn(k, self.state)
        row = self.trainer.last_row if self.state.step > k else {}  # a non-finite loss made no step
        plateau = not failed and self.trainer.plateau_reached(self.state)
        return row, failed, None if failed else self.weights(self.state.step), plateau

    def finish(self, ok: bool, stop_reason: str) -> tuple[str | None, float, dict[str, dict[str, float]]]:
        """The final evaluation and checkpoint; returns (checkpoint, RL seconds, evaluations)."""
        t = self.trainer
        rl_s = t.close_run(self.state, self.evals, ok, stop_reason)
        t.rollout_side.close()
        return (str(t.last_ckpt) if t.last_ckpt else None), rl_s, self.evals


class RolloutCore:
    """One rollout worker: the rollout side only (:func:`trainer.parts.build_rollout_side`): one
    policy copy inside its engine, no learner model, no optimizer. Runs its share of a batch with
    the batch loop every backend shares (:class:`~trainer.rollout_batch.BatchLoop`), recording the
    episodes in the shared tree and ledger."""

    def __init__(self, cfg: TrainConfig, run_dir: str) -> None:
        logging.basicConfig(level=os.environ.get("FR_AGENTS_LOG", "WARNING"))
        from trainer.parts import build_rollout_side
        from trainer.rollout_batch import BatchLoop

        torch.set_num_threads(1)
        self.side = build_rollout_side(cfg, run_dir)
        self.batches = BatchLoop.of_side(self.side)  # the whole share at once

    def run(
        self, episodes: list[int], k: int, weights: dict[str, torch.Tensor], version: int
    ) -> list[tuple[int, float, int]]:
        """Run this worker's share ``episodes`` of batch ``k`` with ``weights`` (version ``version``);
        returns ``(episode, reward, policy tokens)`` of those it ran (acknowledged ones are skipped)."""
        ran = asyncio.run(self.batches.run(k, weights, version, episodes=set(episodes)))
        return [(spec.episode, out.reward, out.policy_tokens) for spec, out in ran]


def run_training_ray(
    cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, num_cpus: int | None = None
) -> TrainResult:
    """Train ``cfg`` with Ray actors; connects to ``RAY_ADDRESS`` (after ``ray start``) or starts a
    local Ray."""
    from trainer.batches import EpisodeSchedule
    from trainer.preflight import warn_recipe

    warn_recipe(cfg)
    ray = _ray()
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    started_ray = False
    if not ray.is_initialized():
        addr = os.environ.get("RAY_ADDRESS")
        env = runtime_env(remote=bool(addr))
        if addr:
            ray.init(address=addr, runtime_env=env)
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, runtime_env=env)
        started_ray = True
    t0 = time.perf_counter()
    gpu = cfg.trainer.device.startswith("cuda")
    learner_cpus = max(1, cfg.trainer.threads or 1)
    cpus = int(ray.available_resources().get("CPU", 1))
    n_workers = max(1, min(cpus - learner_cpus, cfg.trainer.batch_size))
    Learner = ray.remote(LearnerCore).options(num_cpus=learner_cpus, num_gpus=1 if gpu else 0)
    Worker = ray.remote(RolloutCore).options(**rollout_worker_resources(cfg))
    learner = Learner.remote(cfg, str(run_dir))
    workers = [Worker.remote(cfg, str(run_dir)) for _ in range(n_workers)]
    log.info("ray: 1 learner (%d CPU) + %d rollout workers", learner_cpus, n_workers)

    first, rl_before = ray.get(learner.setup.remote(resume))
    group = cfg.objective.grpo_group_size if cfg.objective.algo == "grpo" else 1
    # the driver only needs the schedule's shape; task count comes from the learner's split
    num_tasks = ray.get(learner.num_tasks.remote())
    schedule = EpisodeSchedule(
        num_tasks=num_tasks,
        batch_size=cfg.trainer.batch_size,
        group_size=group,
        leaves_per_episode=leaves_per_tree(cfg),
        max_policy_lag=cfg.rollout.max_policy_lag,
        seed=cfg.trainer.seed,
        task_seed=cfg.tasks.seed,
    )
    steps, lag = cfg.trainer.steps, cfg.rollout.max_policy_lag
    # the versions the next batches sample with (after a resume, older ones come from the checkpoint)
    weights: dict[int, Any] = {v: learner.weights.remote(v) for v in range(max(0, first - lag), first + 1)}
    pending: dict[int, list[Any]] = {}

    def launch(k: int) -> None:
        v = schedule.sampling_version(k)
        eps = [s.episode for s in schedule.episodes(k)]
        parts = [eps[i::n_workers] for i in range(n_workers)]
        pending[k] = [w.run.remote(p, k, weights[v], v) for w, p in zip(workers, parts, strict=True) if p]

    for k in range(first, min(steps, first + lag + 1)):
        launch(k)
    budget = cfg.trainer.max_minutes * 60 - rl_before if cfg.trainer.max_minutes > 0 else float("inf")
    deadline = time.perf_counter() + budget
    done, stop, ok = first, "steps", True
    try:
        step_s = 0.0  # the last learner step's seconds: a step expected to end past the budget is not started
        for k in range(first, steps):
            ray.get(pending.pop(k))
            if time.perf_counter() + step_s > deadline:
                stop = "time budget"
                break
            row, failed, w_ref, plateau = learner.step.options(num_returns=4).remote(k)
            failed = ray.get(failed)
            if failed:
                stop, ok = failed, False
                break
            if ray.get(plateau):
                done, stop = k + 1, "plateau"
                break
            weights[k + 1] = w_ref
            if k + 1 + lag < steps:
                launch(k + 1 + lag)
            done = k + 1
            row = ray.get(row)
            step_s = row.get("step_seconds", 0.0)
            log.info("ray step %d: reward %.3f", done, row["reward"])
            for v in [v for v in weights if v < done - lag]:
                del weights[v]
            if time.perf_counter() > deadline:
                stop = "time budget"
                break
        if ok:
            for refs in pending.values():  # batches launched ahead of a time-budget stop finish cleanly
                ray.get(refs)
        ckpt, rl_s, evals = ray.get(learner.finish.remote(ok, stop))
    finally:
        for a in [learner, *workers]:
            ray.kill(a)
        if started_ray:
            ray.shutdown()
    return TrainResult(
        ok=ok,
        run_dir=run_dir,
        steps=done,
        stop_reason=stop,
        wall_s=time.perf_counter() - t0,
        rl_s=rl_s,
        evals=evals,
        last_checkpoint=Path(ckpt) if ckpt else None,
    )
