"""The asynchronous training loop: rollout and learning at the same time, bounded staleness.

Two threads share a durable :class:`~fr_agents.tree.TrajectoryTree` in the run directory::

    rollout thread (asyncio)                          main thread (learner)
    ─────────────────────────                         ─────────────────────
    for batch k = s, s+1, …:                          for step k = s, s+1, …:
      wait until version k-lag is published  ◄─────┐    wait until batch k is complete
      engine.set_weights(weights[k-lag], k-lag)    │    export batch k from the tree
      run batch k's episodes concurrently ──► tree │    learner.step(batch)  (version k -> k+1)
      (each finished episode -> ledger)            └──  publish weights[k+1]
                                                        metrics, plot, checkpoint

The schedule (:mod:`trainer.schedule`) fixes which episodes form batch ``k`` and which policy
version samples them, so rollout can run up to ``max_policy_lag`` batches ahead of the learner
(that is the admission control: an episode starts only when its trajectory will be at most
``max_policy_lag`` versions old when consumed) while the data stays independent of thread timing.
Finished work is never discarded; every batch is consumed exactly once, in order.

Stops: ``trainer.steps`` reached, ``trainer.max_minutes`` elapsed, a non-finite loss (the batch is
saved to ``RUN_DIR/nan_batch_step<k>.pt``, the last good checkpoint is kept), or the collapse guard
(batch reward falling below half its starting level).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fr_agents.config import ConfigError, TrainConfig
from trainer.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    load_rollout_weights,
    save_checkpoint,
)
from trainer.ledger import EpisodeLedger
from trainer.metrics import MetricsSink, truncate_metrics
from trainer.schedule import EpisodeSchedule, EpisodeSpec

log = logging.getLogger(__name__)



class TrainingStopped(Exception):
    """Raised inside the rollout thread when the run is stopping."""


@dataclass
class TrainResult:
    """What one ``fr-agents train`` run did."""

    ok: bool
    run_dir: Path
    steps: int
    stop_reason: str
    wall_s: float
    rl_s: float
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    last_checkpoint: Path | None = None

    def summary(self) -> str:
        lines = [f"run {self.run_dir}: {self.steps} steps, stopped: {self.stop_reason}, wall {self.wall_s:.0f}s (RL {self.rl_s:.0f}s)"]
        for name, ev in self.evals.items():
            lines.append(f"  held-out success {name}: {100 * ev['success']:.1f}% ({int(ev['episodes'])} tasks)")
        if self.last_checkpoint:
            lines.append(f"  last checkpoint: {self.last_checkpoint}")
        return "\n".join(lines)


# =========================================================================== weights


class WeightBoard:
    """Published policy versions (CPU copies) that rollout may still need; versions wait here."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._weights: dict[int, dict[str, torch.Tensor]] = {}
        self.stopped = False

    def publish(self, version: int, model_or_sd: Any) -> None:
        sd = model_or_sd.state_dict() if hasattr(model_or_sd, "state_dict") else model_or_sd
        copy = {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}
        with self._cond:
            self._weights[version] = copy
            self._cond.notify_all()

    def wait_for(self, version: int, timeout: float | None = None) -> dict[str, torch.Tensor]:
        """Block until ``version`` is published (the admission rule); raises when stopping."""
        with self._cond:
            ok = self._cond.wait_for(lambda: version in self._weights or self.stopped, timeout)
            if self.stopped:
                raise TrainingStopped()
            if not ok:
                raise TimeoutError(f"policy version {version} was not published in time")
            return self._weights[version]

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        with self._cond:
            return self._weights.get(version)

    def drop_below(self, version: int) -> None:
        with self._cond:
            for v in [v for v in self._weights if v < version]:
                del self._weights[v]

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


# =========================================================================== the rollout side


class RolloutThread(threading.Thread):
    """Runs batches of scheduled episodes on its own asyncio loop, never ahead of the lag bound."""

    def __init__(
        self,
        *,
        schedule: EpisodeSchedule,
        first_batch: int,
        last_batch: int,
        board: WeightBoard,
        ledger: EpisodeLedger,
        set_weights: Callable[[dict[str, torch.Tensor], int], None],
        run_episode: Callable[[EpisodeSpec], Any],
        concurrency: int,
        on_batch_done: Callable[[int], None],
    ) -> None:
        super().__init__(name="rollout", daemon=True)
        self.schedule = schedule
        self.next_batch = first_batch
        self.last_batch = last_batch
        self.board = board
        self.ledger = ledger
        self.set_weights = set_weights
        self.run_episode = run_episode
        self.concurrency = max(1, concurrency)
        self.on_batch_done = on_batch_done
        self.error: BaseException | None = None
        self._loop_version: int | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except TrainingStopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread
            self.error = e
            log.exception("rollout thread failed")
            self.on_batch_done(-1)

    async def _main(self) -> None:
        sem = asyncio.Semaphore(self.concurrency)
        while self.next_batch < self.last_batch and not self.board.stopped:
            k = self.next_batch
            version = self.schedule.sampling_version(k)
            weights = await asyncio.to_thread(self.board.wait_for, version)
            if self._loop_version != version:
                self.set_weights(weights, version)
                self._loop_version = version
            specs = self.schedule.episodes(k)
            done = self.ledger.leaves(s.episode for s in specs)
            todo = [s for s in specs if s.episode not in done]

            async def one(spec: EpisodeSpec) -> None:
                async with sem:
                    if self.board.stopped:
                        raise TrainingStopped()
                    out = await self.run_episode(spec)
                    self.ledger.record(spec.episode, spec.batch, out.leaf_id, out.reward, out.policy_tokens, spec.version)

            tasks = [asyncio.create_task(one(s)) for s in todo]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            self.next_batch = k + 1
            self.on_batch_done(k)


# =========================================================================== the trainer


def _threads(cfg: TrainConfig) -> int:
    return cfg.trainer.threads or max(1, (os.cpu_count() or 2) // 2)


class Trainer:
    """One run: builds the parts from a config and drives rollout + learning (see module doc)."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, *, console: bool = True) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.lag = cfg.rollout.max_policy_lag
        self._ready = threading.Condition()
        self._batches_done = -1
        self.lag_histogram: collections.Counter[int] = collections.Counter()

    # ------------------------------------------------------------------ parts

    def _build(self) -> None:
        """The learner side (policy model, learner, periodic evaluator) and the rollout side
        (:func:`trainer.parts.build_rollout_side`, whose engine holds its own policy copy)."""
        from fr_agents.models import load_policy
        from fr_agents.plugins import load_object
        from trainer.learner import Learner
        from trainer.parts import build_rollout_side, model_dir

        cfg = self.cfg
        torch.set_num_threads(_threads(cfg))
        torch.manual_seed(cfg.trainer.seed)
        self.model_dir = model_dir(cfg)
        self.model, self.tokenizer = load_policy(str(self.model_dir), cfg.model.dtype, cfg.trainer.device)
        self.model.train()
        self.learner = Learner.from_config(self.model, cfg)
        self.periodic = None  # avg@k every trainer.eval_every steps when trainer.eval_k > 0
        if cfg.trainer.eval_k > 0 and cfg.trainer.eval_every > 0:
            from fr_agents.eval.periodic import PeriodicEval

            bench_for = load_object(cfg.trainer.eval_bench_provider, key="trainer.eval_bench_provider")
            self.periodic = PeriodicEval.from_config(cfg, self.run_dir, bench_for(cfg))
        # on Ray the rollout workers hold the engines; the learner's side only encodes and records
        side = build_rollout_side(
            cfg, self.run_dir, tokenizer=self.tokenizer, engine_model=self.model, with_engine=cfg.trainer.backend == "local"
        )
        self.rollout_side = side
        self.make_env, self.tree, self.ledger = side.make_env, side.tree, side.ledger
        self.train_tasks, self.test_tasks = side.train_tasks, side.test_tasks
        self.demo_tasks, self.rl_tasks = side.demo_tasks, side.rl_tasks
        self.schedule, self.runner = side.schedule, side.runner

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, name: str, step: int) -> dict[str, float] | None:
        if self.cfg.trainer.eval_episodes <= 0 or self.cfg.env.max_turns != 1:
            return None
        from trainer.evaluate import evaluate_single_turn

        n = min(self.cfg.trainer.eval_episodes, len(self.test_tasks))
        res = evaluate_single_turn(
            self.model,
            self.tokenizer,
            self.test_tasks.shuffled(self.cfg.tasks.seed)[:n],  # a fixed, unbiased subset
            make_env=self.make_env,
            encode=self.runner.encode_observation,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            eos_ids=self.runner.stop_ids,
        )
        row = {**res.as_dict(), "name": name, "step": step}
        self.metrics.event("eval", **row)
        log.info("held-out success %s (step %d): %.1f%% (%d tasks, %.1fs)", name, step, 100 * res.success, res.episodes, res.seconds)
        for obs, text, reward in res.samples[:3]:
            log.info("  %r -> %r (reward %s)", obs, text, reward)
        return res.as_dict()

    def _warm_start(self, state: TrainerState) -> None:
        from trainer.warm_start import build_demos, warm_start

        ws = self.cfg.warm_start
        demos = build_demos(self.demo_tasks, encode_prompt=self.runner.encode_task, encode_answer=self.runner.encode_answer)
        res = warm_start(
            self.model,
            demos,
            epochs=ws.epochs,
            lr=ws.lr,
            batch_size=ws.batch_size,
            pad_id=self.runner.pad_id,
            seed=self.cfg.trainer.seed,
            max_minutes=ws.max_minutes,
        )
        self.model.train()
        state.warm_start["result"] = {"examples": res.examples, "steps": res.steps, "loss": res.final_loss, "seconds": res.seconds}
        self.metrics.event("warm_start", examples=res.examples, steps=res.steps, loss=res.final_loss, seconds=res.seconds)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint(self, state: TrainerState) -> Path:
        state.version = self.learner.version
        state.extra["store_cursor"] = self.tree.cursor()
        state.extra["lag_histogram"] = {str(k): v for k, v in self.lag_histogram.items()}
        needed = range(max(0, state.step - self.lag), state.step)
        older = {v: w for v in needed if (w := self.board.get(v)) is not None}
        return save_checkpoint(
            self.run_dir,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.learner.optimizer,
            scheduler=self.learner.scheduler,
            state=state,
            rollout_weights=older,
            keep=self.cfg.trainer.keep_checkpoints,
        )

    # ------------------------------------------------------------------ batches

    def _on_batch_done(self, k: int) -> None:
        with self._ready:
            self._batches_done = max(self._batches_done, k) if k >= 0 else self._batches_done
            self._ready.notify_all()

    def _wait_batch(self, k: int, rollout: RolloutThread, deadline: float) -> bool:
        """Wait until batch ``k`` is complete; False when the time budget ran out first."""
        with self._ready:
            while self._batches_done < k:
                if rollout.error is not None:
                    raise RuntimeError(f"rollout failed: {rollout.error!r}") from rollout.error
                if not rollout.is_alive() and self._batches_done < k:
                    raise RuntimeError("rollout thread ended before producing the batch")
                if time.monotonic() > deadline:
                    return False
                self._ready.wait(timeout=0.5)
        return True

    def _export(self, k: int) -> tuple[Any, list[int], list[tuple[int, int, float, int, int]]]:
        rows = self.ledger.batch_rows(k)
        expected = [s.episode for s in self.schedule.episodes(k)]
        if [r[0] for r in rows] != expected:
            raise RuntimeError(f"batch {k}: the ledger holds episodes {[r[0] for r in rows][:5]}…, expected {expected[:5]}…")
        leaves = [r[1] for r in rows]
        reward_mode = self.cfg.rollout.reward
        flat = self.tree.export_flat(leaves, reward_mode)
        shared = len(set(flat.root_ids)) < len(leaves)
        packed_mode = self.cfg.trainer.packed
        if packed_mode == "always" or (packed_mode == "auto" and shared):
            return self.tree.export_packed(leaves, reward_mode), leaves, rows
        return flat, leaves, rows

    def _save_bad_batch(self, k: int, batch: Any, leaves: list[int], err: Exception) -> Path:
        path = self.run_dir / f"nan_batch_step{k}.pt"
        flat = batch.flat if hasattr(batch, "flat") else batch
        torch.save(
            {
                "step": k,
                "error": str(err),
                "leaf_ids": leaves,
                "token_ids": flat.token_ids,
                "behavior_logprobs": flat.behavior_logprobs,
                "action_mask": flat.action_mask,
                "rewards": flat.rewards,
                "versions": flat.versions,
                "stats": getattr(err, "stats", {}),
            },
            path,
        )
        return path

    # ------------------------------------------------------------------ the run

    def open_run(self, resume: bool) -> tuple[TrainerState, dict[str, dict[str, float]]]:
        """Build the parts and the metrics sink; restore the latest checkpoint (``resume``) or run
        the pre-RL evaluations and the warm start. Version ``learner.version`` is published."""
        cfg = self.cfg
        self._build()
        if self.console:  # the progress line carries the learner's per-step figures
            logging.getLogger("trainer.learner").setLevel(logging.WARNING)
        self.metrics = MetricsSink(
            self.run_dir, plot_every=cfg.trainer.plot_every, log_every=cfg.trainer.log_every, console=self.console
        )
        self.board = WeightBoard()
        engine = type(self.runner.engine).__name__ if self.runner.engine is not None else f"{cfg.rollout.engine} (rollout workers)"
        self.metrics.event("start", engine=engine, backend=cfg.trainer.backend, resume=resume)
        state = TrainerState()
        evals: dict[str, dict[str, float]] = {}
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is None:
                raise ConfigError(f"--resume: {self.run_dir} has no complete checkpoint")
            state = load_checkpoint(ckpt, model=self.model, optimizer=self.learner.optimizer, scheduler=self.learner.scheduler)
            self.learner.version = state.version
            self.tree.rewind(int(state.extra.get("store_cursor", state.step)))
            truncate_metrics(self.run_dir, state.step)
            self.metrics.reopen()
            self.lag_histogram.update({int(k): v for k, v in state.extra.get("lag_histogram", {}).items()})
            for v, w in load_rollout_weights(ckpt).items():
                self.board.publish(v, w)
            evals = dict(state.extra.get("evals", {}))
            log.info("resumed from %s at step %d (open episodes in the store: %d)", ckpt, state.step, len(self.tree.open_paths()))
        else:
            ev = self.evaluate("before", 0)
            if ev:
                evals["before"] = ev
            if cfg.warm_start.examples > 0:
                self._warm_start(state)
                ev = self.evaluate("after_warm_start", 0)
                if ev:
                    evals["after_warm_start"] = ev
            state.extra["evals"] = evals
        self.board.publish(self.learner.version, self.model)
        self.last_ckpt = self._checkpoint(state) if not resume else latest_checkpoint(self.run_dir)
        self._start_rl_clock()
        return state, evals

    def _start_rl_clock(self) -> None:
        self._rl_started = time.monotonic()
        self._recent: collections.deque[float] = collections.deque(maxlen=10)
        self._first_rewards: list[float] = []
        self._last_step_end = time.perf_counter()

    def rl_deadline(self, state: TrainerState) -> float:
        """``time.monotonic()`` at which ``trainer.max_minutes`` of RL (resumed runs included) is spent."""
        budget = self.cfg.trainer.max_minutes * 60 - state.rl_elapsed_s if self.cfg.trainer.max_minutes > 0 else math.inf
        return self._rl_started + budget

    def learn(self, k: int, state: TrainerState) -> str | None:
        """Step ``k`` on the complete batch ``k``: export it, one optimizer step, publish version
        ``k + 1``, metrics (``self.last_row``), evaluations, guards, checkpoint.

        Returns ``None`` to go on, or why the run must stop (a non-finite loss, the collapse
        guard): the run then ends not ok, with the last good checkpoint kept.
        """
        cfg = self.cfg
        batch, leaves, rows = self._export(k)
        flat = batch.flat if hasattr(batch, "flat") else batch
        try:
            stats = self.learner.step(batch)
        except Exception as e:
            from trainer.learner import NonFiniteLossError

            if not isinstance(e, NonFiniteLossError):
                raise
            path = self._save_bad_batch(k, batch, leaves, e)
            log.error("non-finite loss at step %d: %s; batch saved to %s; last good checkpoint %s", k, e, path, self.last_ckpt)
            self.metrics.event("stop", step=k, reason="non-finite loss", batch_file=str(path))
            return "non-finite loss"
        self.tree.mark_consumed(sorted(set(leaves)))
        state.step = k + 1
        self.board.publish(self.learner.version, self.model)
        self.board.drop_below(max(0, state.step - self.lag))
        lags = self._lags(flat, k)
        now = time.perf_counter()
        reward = float(sum(r[2] for r in rows) / len(rows))
        tokens = sum(r[3] for r in rows)
        row = {
            "step": state.step,
            "version": self.learner.version,
            "reward": reward,
            "acceptance": stats.get("acceptance_rate", float("nan")),
            "loss": stats["loss"],
            "tokens": tokens,
            "tokens_per_s": tokens / max(1e-9, now - self._last_step_end),
            "lag_mean": sum(lags) / max(1, len(lags)),
            "lag_max": max(lags, default=0),
            "lag_hist": dict(collections.Counter(lags)),
            "elapsed_s": state.rl_elapsed_s + (time.monotonic() - self._rl_started),
            **{k2: v for k2, v in stats.items() if k2 not in ("loss",)},
        }
        self._last_step_end = now
        self.last_row = row
        self.metrics.step(row)
        self._recent.append(reward)
        if len(self._first_rewards) < 5 and state.baseline_reward is None:
            self._first_rewards.append(reward)
            if len(self._first_rewards) == 5:
                state.baseline_reward = sum(self._first_rewards) / 5
        if cfg.trainer.eval_every and state.step % cfg.trainer.eval_every == 0:
            self.evaluate("during", state.step)
        if self.periodic is not None and self.periodic.due(state.step):
            self.metrics.event("eval_at_k", **self.periodic.run(state.step, self.model, self.tokenizer))
        if self._collapsed(state, self._recent):
            reason = "collapse guard (batch reward fell below half its start)"
            log.error("%s at step %d; last good checkpoint %s", reason, state.step, self.last_ckpt)
            self.metrics.event("stop", step=state.step, reason=reason)
            return reason
        if cfg.trainer.checkpoint_every and state.step % cfg.trainer.checkpoint_every == 0:
            state.rl_elapsed_s += time.monotonic() - self._rl_started
            self._rl_started = time.monotonic()
            self.last_ckpt = self._checkpoint(state)
        return None

    def close_run(self, state: TrainerState, evals: dict[str, dict[str, float]], ok: bool, stop_reason: str) -> float:
        """The end of the RL phase: the final evaluation and checkpoint (when ``ok``), the ``end``
        event; closes the metrics sink. Returns the RL seconds (resumed runs included)."""
        state.rl_elapsed_s += time.monotonic() - self._rl_started
        self._rl_started = time.monotonic()
        if ok:
            ev = self.evaluate("after_rl", state.step)
            if ev:
                evals["after_rl"] = ev
            state.extra["evals"] = evals
            self.last_ckpt = self._checkpoint(state)
        self.metrics.event("end", step=state.step, reason=stop_reason, lag_histogram={str(k): v for k, v in self.lag_histogram.items()})
        self.metrics.close()
        return state.rl_elapsed_s

    def run(self, *, resume: bool = False) -> TrainResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        state, evals = self.open_run(resume)
        deadline = self.rl_deadline(state)
        rollout = RolloutThread(
            schedule=self.schedule,
            first_batch=state.step,
            last_batch=cfg.trainer.steps,
            board=self.board,
            ledger=self.ledger,
            set_weights=self.runner.set_weights,
            run_episode=self.runner.run,
            concurrency=cfg.rollout.concurrency,
            on_batch_done=self._on_batch_done,
        )
        self._batches_done = state.step - 1
        rollout.start()
        stop_reason = "steps"
        ok = True
        try:
            while state.step < cfg.trainer.steps:
                k = state.step
                if not self._wait_batch(k, rollout, deadline):
                    stop_reason = "time budget"
                    break
                failed = self.learn(k, state)
                if failed:
                    stop_reason, ok = failed, False
                    break
        finally:
            self.board.stop()
            rollout.join(timeout=60)
        rl_elapsed = self.close_run(state, evals, ok, stop_reason)
        self.runner.close()
        self.ledger.close()
        self.tree.close()
        return TrainResult(
            ok=ok,
            run_dir=self.run_dir,
            steps=state.step,
            stop_reason=stop_reason,
            wall_s=time.perf_counter() - t0,
            rl_s=rl_elapsed,
            evals=evals,
            last_checkpoint=self.last_ckpt,
        )

    def _lags(self, flat: Any, k: int) -> list[int]:
        """Per-trajectory lag: learner version at the step minus the oldest version on the path."""
        v = flat.versions.masked_fill(~flat.action_mask, 1 << 40)
        oldest = v.min(dim=1).values.tolist()
        lags = [int(k - o) for o in oldest]
        self.lag_histogram.update(lags)
        if max(lags, default=0) > self.lag:
            raise RuntimeError(f"step {k}: a trajectory lags {max(lags)} versions > max_policy_lag={self.lag}")
        return lags

    def _collapsed(self, state: TrainerState, recent: collections.deque[float]) -> bool:
        base = state.baseline_reward
        if not self.cfg.trainer.collapse_guard or base is None or base < 0.05 or len(recent) < recent.maxlen:
            return False
        return sum(recent) / len(recent) < 0.5 * base


def run_training(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, console: bool = True) -> TrainResult:
    """Train ``cfg`` in ``run_dir`` (``resume``: continue from its latest checkpoint)."""
    return Trainer(cfg, run_dir, console=console).run(resume=resume)
