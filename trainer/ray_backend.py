"""``trainer.backend=ray``: rollout workers and the learner as Ray actors.

The same schedule, ledger and tree as the embedded loop (:mod:`trainer.loop`), spread over
processes (and, after ``ray start``, machines)::

    driver                         LearnerActor (num_cpus / num_gpus)      RolloutWorker x W (num_cpus=1)
    ──────                         ─────────────────────────────────      ────────────────────────────
    launch batches 0..lag  ───────────────────────────────────────────►  run(specs, weights[v], v)
    for k: wait batch k            step(k): export batch k from the      set weights if v changed,
           learner.step(k) ──────► tree, one optimizer step, return  ──► run episodes -> tree + ledger
           launch batch k+1+lag    the new weights (object store)

Weight sync goes through the Ray object store: ``LearnerActor.step`` returns the new CPU state
dict as an object ref; batch ``k+1+lag`` is launched at once with that ref as its argument, so Ray
starts it as soon as the weights exist and every worker on a node reads the same shared copy.
Staleness is the embedded loop's: batch ``k`` is sampled with version ``k - max_policy_lag``.

The tree and ledger are SQLite files in the run directory, written by every worker (WAL mode);
on a multi-node cluster the run directory must be on a shared filesystem.

GPUs (documented, untested here): give the learner ``num_gpus=1`` per training GPU and each
rollout worker ``num_gpus=1``; replace the object-store hop by an NCCL broadcast -- create a
``torch.distributed`` group (``backend="nccl"``) spanning the learner rank 0 and every worker,
``dist.broadcast(param, src=0)`` each parameter into the workers' engine buffers after each step
(``ray.util.collective`` offers the same over NCCL). That path needs GPUs and is not exercised by
the tests. Resume and elastic pools are not supported with this backend yet (the embedded loop
has both).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from fr_agents.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ConfigError("trainer.backend=ray: ray is not installed (pip install 'ray[default]')") from e
    return ray


class _Base:
    """Builds the embedded trainer's parts (model, tree, ledger, schedule, runner) in this process."""

    def __init__(self, cfg: TrainConfig, run_dir: str) -> None:
        logging.basicConfig(level=os.environ.get("FR_AGENTS_LOG", "WARNING"))
        from trainer.loop import Trainer

        self.trainer = Trainer(cfg, run_dir, console=False)
        self.trainer._build()


class LearnerCore(_Base):
    """The learner side: warm start, one optimizer step per batch, checkpoints."""

    def setup(self) -> dict[str, torch.Tensor]:
        """Warm start (when configured) and return version 0's weights."""
        from trainer.checkpoint import TrainerState
        from trainer.loop import WeightBoard
        from trainer.metrics import MetricsSink

        t = self.trainer
        t.metrics = MetricsSink(t.run_dir, plot_every=t.cfg.trainer.plot_every, console=False)
        t.board = WeightBoard()
        self.state = TrainerState()
        if t.cfg.warm_start.examples > 0:
            t._warm_start(self.state)
        return self.weights()

    def num_tasks(self) -> int:
        return len(self.trainer.rl_tasks)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.trainer.model.state_dict().items()}

    def step(self, k: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        t = self.trainer
        batch, leaves, rows = t._export(k)
        stats = t.learner.step(batch)
        t.tree.mark_consumed(sorted(set(leaves)))
        self.state.step = k + 1
        row = {
            "step": k + 1,
            "version": t.learner.version,
            "reward": float(sum(r[2] for r in rows) / len(rows)),
            "tokens": sum(r[3] for r in rows),
            **{key: float(v) for key, v in stats.items() if isinstance(v, (int, float))},
        }
        t.metrics.step(row)
        return row, self.weights()

    def finish(self, rl_s: float) -> str:
        t = self.trainer
        self.state.rl_elapsed_s = rl_s
        path = t._checkpoint(self.state)
        t.metrics.close()
        return str(path)


class RolloutCore(_Base):
    """One rollout worker: its own engine; runs the episodes it is given and records them."""

    def __init__(self, cfg: TrainConfig, run_dir: str) -> None:
        super().__init__(cfg, run_dir)
        self.version: int | None = None

    def run(self, episodes: list[int], k: int, weights: dict[str, torch.Tensor], version: int) -> list[tuple[int, float, int]]:
        t = self.trainer
        if self.version != version:
            t.runner.set_weights(weights, version)
            self.version = version
        specs = [s for s in t.schedule.episodes(k) if s.episode in set(episodes)]

        async def go() -> list[tuple[int, float, int]]:
            async def one(spec: Any) -> tuple[int, float, int]:
                out = await t.runner.run(spec)
                t.ledger.record(spec.episode, spec.batch, out.leaf_id, out.reward, out.policy_tokens, spec.version)
                return spec.episode, out.reward, out.policy_tokens

            return list(await asyncio.gather(*(one(s) for s in specs)))

        return asyncio.run(go())


def run_training_ray(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, num_cpus: int | None = None) -> Any:
    """Train ``cfg`` with Ray actors; connects to ``RAY_ADDRESS`` (after ``ray start``) or starts a local Ray."""
    from trainer.loop import TrainResult
    from trainer.schedule import EpisodeSchedule

    if resume:
        raise ConfigError("trainer.backend=ray: --resume is not supported yet; use trainer.backend=local")
    ray = _ray()
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    started_ray = False
    if not ray.is_initialized():
        addr = os.environ.get("RAY_ADDRESS")
        repo = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
        env = {"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}}
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
    Worker = ray.remote(RolloutCore).options(num_cpus=1, num_gpus=1 if gpu else 0)
    learner = Learner.remote(cfg, str(run_dir))
    workers = [Worker.remote(cfg, str(run_dir)) for _ in range(n_workers)]
    log.info("ray: 1 learner (%d CPU) + %d rollout workers", learner_cpus, n_workers)

    group = cfg.objective.grpo_group_size if cfg.objective.algo == "grpo" else 1
    # the driver only needs the schedule's shape; task count comes from the learner's split
    num_tasks = ray.get(learner.num_tasks.remote())
    schedule = EpisodeSchedule(
        num_tasks=num_tasks, batch_size=cfg.trainer.batch_size, group_size=group,
        max_policy_lag=cfg.rollout.max_policy_lag, seed=cfg.trainer.seed, task_seed=cfg.tasks.seed,
    )
    weights: dict[int, Any] = {0: learner.setup.remote()}
    pending: dict[int, list[Any]] = {}
    steps, lag = cfg.trainer.steps, cfg.rollout.max_policy_lag

    def launch(k: int) -> None:
        v = schedule.sampling_version(k)
        eps = [s.episode for s in schedule.episodes(k)]
        parts = [eps[i::n_workers] for i in range(n_workers)]
        pending[k] = [w.run.remote(p, k, weights[v], v) for w, p in zip(workers, parts, strict=True) if p]

    for k in range(min(steps, lag + 1)):
        launch(k)
    rl_started = time.perf_counter()
    deadline = rl_started + cfg.trainer.max_minutes * 60 if cfg.trainer.max_minutes > 0 else float("inf")
    done, stop = 0, "steps"
    try:
        for k in range(steps):
            ray.get(pending.pop(k))
            row_ref, w_ref = learner.step.options(num_returns=2).remote(k)
            weights[k + 1] = w_ref
            if k + 1 + lag < steps:
                launch(k + 1 + lag)
            row = ray.get(row_ref)
            done = k + 1
            log.info("ray step %d: reward %.3f", done, row["reward"])
            for v in [v for v in weights if v < done - lag]:
                del weights[v]
            if time.perf_counter() > deadline:
                stop = "time budget"
                break
        rl_s = time.perf_counter() - rl_started
        for refs in pending.values():  # batches launched ahead of a time-budget stop finish cleanly
            ray.get(refs)
        ckpt = ray.get(learner.finish.remote(rl_s))
    finally:
        for a in [learner, *workers]:
            ray.kill(a)
        if started_ray:
            ray.shutdown()
    return TrainResult(
        ok=True, run_dir=run_dir, steps=done, stop_reason=stop, wall_s=time.perf_counter() - t0,
        rl_s=rl_s, last_checkpoint=Path(ckpt),
    )
