"""The asynchronous training loop: rollout and learning at the same time, bounded staleness.

The rollout and the learner share a durable :class:`~fr_agents.tree.TrajectoryTree` in the run
directory. The rollout runs in a child process of its own (``trainer.backend=process``, the default:
:mod:`trainer.rollout_process`, no GIL shared with the learner) or in a thread beside the learner
(``local``); either way it is the same loop::

    rollout (asyncio)                                 main thread (learner)
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

The parts come from two builders (:mod:`trainer.parts`: the rollout side, the learner side);
batches follow one path (:mod:`trainer.batches`: schedule -> ledger -> tree export -> learner);
the guards (:mod:`trainer.guards`), the warm start and checkpoints live in their own modules, and
a run is extended by :class:`~trainer.hooks.TrainerHooks` (the elastic runtime is one).

Stops: ``trainer.steps`` reached, ``trainer.max_minutes`` elapsed, a non-finite loss (the batch is
saved to ``RUN_DIR/nan_batch_step<k>.pt``), or the collapse guard (batch reward falling below half
its starting level). After either guard the run's result is its last good checkpoint: it is loaded
back and evaluated held out as ``after_rl``, at that checkpoint's step.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fr_agents.config import ConfigError, TrainConfig
from trainer.affinity import pinned
from trainer.batches import BatchTrees, export_batch, save_bad_batch
from trainer.checkpoint import TrainerState, checkpoint_run, latest_checkpoint, load_weights, resume_run
from trainer.guards import Guards, Plateau
from trainer.hooks import TrainerHooks, acts_inside_rollout, as_hooks
from trainer.os_tuning import cpu_split, freeze_gc, rollout_threads, warm_start_cores, why_not_pinned
from trainer.rollout_process import RolloutProcess
from trainer.rollout_thread import RolloutThread

log = logging.getLogger(__name__)

MARK_EVERY = 25  # trained batches marked consumed in the store per transaction (Trainer._mark_consumed)


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
            per_episode = f", {ev['turns']:.1f} turns, {ev['tool_calls']:.1f} tool calls" if "turns" in ev else ""
            kept = f", the last good checkpoint (step {ev['checkpoint_step']})" if "checkpoint_step" in ev else ""
            lines.append(
                f"  held-out success {name}: {100 * ev['success']:.1f}% ({int(ev['episodes'])} tasks, "
                f"reward {ev['reward']:.3f}{per_episode}{kept})"
            )
        if self.last_checkpoint:
            lines.append(f"  last checkpoint: {self.last_checkpoint}")
        return "\n".join(lines)


class Trainer:
    """One run: builds both sides from a config and drives rollout + learning (see module doc).

    ``hooks``: a :class:`~trainer.hooks.TrainerHooks` that extends the run, or a list of them
    (they compose: :class:`~trainer.hooks.HookList`); default: none.
    """

    def __init__(
        self, cfg: TrainConfig, run_dir: str | Path, *, console: bool = True,
        hooks: TrainerHooks | Sequence[TrainerHooks] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.hooks = as_hooks(hooks)
        self.rollout_process: RolloutProcess | None = None  # trainer.backend=process: spawned by _build
        self.cpus: tuple[list[int], list[int]] | None = None  # trainer.pin_cpus: (learner, rollout) CPUs, by _build
        self._unmarked: list[list[int]] = []  # trained batches not yet marked consumed (_mark_consumed)
        inside = acts_inside_rollout(self.hooks)
        if cfg.trainer.backend == "process" and inside:
            raise ConfigError(
                f"trainer.backend: the hooks {'/'.join(inside)} act inside the rollout, "
                "which trainer.backend=process runs in a child process; use trainer.backend=local"
            )
        self.lag = cfg.rollout.max_policy_lag
        self.guards = Guards(self.lag, cfg.trainer.collapse_guard)
        t = cfg.trainer
        self.plateau = Plateau(t.plateau_patience, t.plateau_window, t.plateau_min_delta)
        self._ready = threading.Condition()
        self._batches_done = -1

    @property
    def lag_histogram(self) -> collections.Counter[int]:
        return self.guards.lag_histogram

    # ------------------------------------------------------------------ parts

    def _build(self) -> None:
        """The learner side, then the rollout side (on Ray its workers hold the engines; here the
        runner only encodes and records). Both are kept whole and by their parts' names."""
        from trainer.parts import build_learner_side, build_rollout_side

        cfg = self.cfg
        ls = self.learner_side = build_learner_side(
            cfg, self.run_dir, console=self.console, before_micro_batch=self.hooks.before_micro_batch
        )
        self.model_dir, self.model, self.tokenizer, self.learner = ls.model_dir, ls.model, ls.tokenizer, ls.learner
        self.board, self.metrics, self.held_out, self.periodic = ls.board, ls.metrics, ls.held_out, ls.periodic
        side = self.rollout_side = build_rollout_side(
            cfg,
            self.run_dir,
            tokenizer=self.tokenizer,
            engine_model=self.model,
            with_engine=cfg.trainer.backend == "local",
            engine=self.hooks.engine,
        )
        self.make_env, self.tree, self.ledger = side.make_env, side.tree, side.ledger
        self.train_tasks, self.test_tasks = side.train_tasks, side.test_tasks
        self.demo_tasks, self.rl_tasks = side.demo_tasks, side.rl_tasks
        self.schedule, self.runner = side.schedule, side.runner
        self.cpus = cpu_split(cfg)  # (learner, rollout) CPUs with trainer.pin_cpus
        if why := why_not_pinned(cfg):
            log.warning("trainer.pin_cpus: nothing is pinned: %s", why)
        if cfg.trainer.backend == "process":  # spawned now: it builds its side while this one evaluates and warm starts
            self.rollout_process = RolloutProcess(
                cfg=cfg, run_dir=self.run_dir, last_batch=cfg.trainer.steps, board=self.board,
                on_batch_done=self._on_batch_done, threads=rollout_threads(cfg),
                cpus=self.cpus[1] if self.cpus else None,
            )
            self.rollout_process.start()

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, name: str, step: int, **extra: Any) -> dict[str, float] | None:
        """Greedy held-out figures now (see :mod:`trainer.evaluate`), logged as an ``eval`` event
        with ``extra`` fields; None when ``trainer.eval_episodes`` is 0."""
        if self.held_out is None:
            return None
        res = {**self.held_out.run(name, step, self.model, self.tokenizer), **extra}
        self.metrics.event("eval", **res, name=name, step=step)
        log.info(
            "held-out %s (step %d): success %.1f%%, reward %.3f, %.1f turns, %.1f tool calls (%d episodes, %.1fs)",
            name, step, 100 * res["success"], res["reward"], res["turns"], res["tool_calls"], res["episodes"], res["seconds"],
        )
        if by_group := res.get("by_group"):
            log.info("held-out %s by group: %s", name, ", ".join(
                f"{g} {100 * m['success']:.0f}% of {m['tasks']}" for g, m in by_group.items()))
        return res

    def _mark_consumed(self, leaves: list[int]) -> None:
        """Mark batch ``leaves`` consumed in the tree, :data:`MARK_EVERY` batches to a transaction.

        The marks serve a resume (which rewinds the store to its checkpoint's cursor, so a mark not
        yet written costs nothing) and tools reading the store. One transaction per step would sit
        on the learner's path: the rollout writes the store all the time, so each transaction
        re-reads its pages and waits for the write lock in SQLite's busy sleeps."""
        self._unmarked.append(leaves)
        if len(self._unmarked) >= MARK_EVERY:
            self._settle_marks()

    def _settle_marks(self) -> None:
        """Write the marks held (before a checkpoint's cursor, at the run's end)."""
        if self._unmarked:
            batches, self._unmarked = self._unmarked, []
            self.tree.mark_consumed_batches(batches, durable=False)

    def _checkpoint(self, state: TrainerState) -> Path:
        self._settle_marks()  # the checkpoint stores the store's cursor: every consumed batch in it
        return checkpoint_run(
            self.run_dir,
            self.learner_side,
            state,
            tree=self.tree,
            lag=self.lag,
            lag_histogram=self.guards.histogram(),
            keep=self.cfg.trainer.keep_checkpoints,
        )

    # ------------------------------------------------------------------ the run

    def open_run(self, resume: bool) -> tuple[TrainerState, dict[str, dict[str, float]]]:
        """Build the parts; restore the latest checkpoint (``resume``) or run the pre-RL
        evaluations and the warm start. Version ``learner.version`` is published. First of all, a
        recipe tuned for another kind of model than ``model.name`` is logged as a WARNING
        (:func:`trainer.preflight.warn_recipe`) and kept in the ``start`` event."""
        from trainer.preflight import warn_recipe

        cfg = self.cfg
        recipe = warn_recipe(cfg)
        self._build()
        self.hooks.run_started(self)
        engine = (
            type(self.runner.engine).__name__ if self.runner.engine is not None
            else f"{cfg.rollout.engine} (rollout {'process' if cfg.trainer.backend == 'process' else 'workers'})"
        )
        self.metrics.event("start", engine=engine, backend=cfg.trainer.backend, resume=resume,
                           **({"recipe_warning": recipe} if recipe else {}))
        state = TrainerState()
        evals: dict[str, dict[str, float]] = {}
        if resume:
            state, ckpt = resume_run(self.run_dir, self.learner_side, tree=self.tree)
            self.guards.restore(state.extra.get("lag_histogram", {}))
            self.plateau.restore(state.extra.get("plateau"))
            evals = dict(state.extra.get("evals", {}))
            log.info("resumed from %s at step %d (open episodes in the store: %d)", ckpt, state.step, len(self.tree.open_paths()))
        else:
            from trainer.warm_start import run_warm_start

            if ev := self.evaluate("before", 0):
                evals["before"] = ev
            if cfg.warm_start.examples > 0:
                with warm_start_cores():  # supervised steps with nothing beside them
                    run_warm_start(cfg, self.model, self.runner, self.demo_tasks, self.metrics, state, self.run_dir)
                if ev := self.evaluate("after_warm_start", 0):
                    evals["after_warm_start"] = ev
            state.extra["evals"] = evals
        self.board.publish(self.learner.version, self.model)
        self.last_ckpt = self._checkpoint(state) if not resume else latest_checkpoint(self.run_dir)
        if self.rollout_process is not None:  # set-up, not RL time (it overlapped the warm start, if any)
            self.rollout_process.wait_ready()
            self.metrics.event("rollout", backend=cfg.trainer.backend, **self.rollout_process.info)
        self._rl_started = time.monotonic()
        self._last_step_end = time.perf_counter()
        return state, evals

    def rl_deadline(self, state: TrainerState) -> float:
        """``time.monotonic()`` at which ``trainer.max_minutes`` of RL (resumed runs included) is spent."""
        budget = self.cfg.trainer.max_minutes * 60 - state.rl_elapsed_s if self.cfg.trainer.max_minutes > 0 else math.inf
        return self._rl_started + budget

    def _spend_rl_time(self, state: TrainerState) -> None:
        state.rl_elapsed_s += time.monotonic() - self._rl_started
        self._rl_started = time.monotonic()

    def learn(self, k: int, state: TrainerState) -> str | None:
        """Step ``k`` on the complete batch ``k``: export it, one optimizer step, publish version
        ``k + 1``, metrics (``self.last_row``), evaluations, guards, checkpoint.

        Returns ``None`` to go on, or why the run must stop (a non-finite loss, the collapse
        guard): the run then ends not ok, with the last good checkpoint kept.
        """
        from trainer.learner import NonFiniteLossError

        cfg = self.cfg
        batch, leaves, rows, trees = export_batch(k, cfg, self.schedule, self.ledger, self.tree)
        flat = batch.flat if hasattr(batch, "flat") else batch
        try:
            if batch is None:  # every episode of batch k aborted: the version advances, nothing is learnt
                stats = {"loss": float("nan"), **self.learner.skip_step()}
            else:
                stats = self.hooks.around_step(lambda: self.learner.step(batch))
        except NonFiniteLossError as e:
            path = save_bad_batch(self.run_dir, k, batch, leaves, e)
            log.error("non-finite loss at step %d: %s; batch saved to %s; last good checkpoint %s", k, e, path, self.last_ckpt)
            self.metrics.event("stop", step=k, reason="non-finite loss", batch_file=str(path))
            return "non-finite loss"
        # the new weights first: the rollout may be waiting for them to start its next batch
        self.board.publish(self.learner.version, self.model)
        if leaves:
            self._mark_consumed(sorted(set(leaves)))
        state.step = k + 1
        self.board.drop_below(max(0, state.step - self.lag))
        lags = self.guards.lags(flat, k) if flat is not None else []
        now = time.perf_counter()
        reward = float(sum(r[2] for r in rows) / len(rows)) if rows else float("nan")
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
            **tree_metrics(batch, trees),
            **{k2: v for k2, v in stats.items() if k2 not in ("loss",)},
        }
        sampled = self.ledger.sampled_tokens(k)  # the engine's count: identical siblings included
        if sampled is not None:
            row["sampled_tokens"] = sampled
        self._last_step_end = now
        self.last_row = row
        self.metrics.step(row)
        if cfg.trainer.eval_every and state.step % cfg.trainer.eval_every == 0:
            self.evaluate("during", state.step)
        if self.periodic is not None and self.periodic.due(state.step):
            self.metrics.event("eval_at_k", **self.periodic.run(state.step, self.model, self.tokenizer))
        if rows and self.guards.collapsed(reward, state):
            reason = "collapse guard (batch reward fell below half its start)"
            log.error("%s at step %d; last good checkpoint %s", reason, state.step, self.last_ckpt)
            self.metrics.event("stop", step=state.step, reason=reason)
            return reason
        if cfg.trainer.checkpoint_every and state.step % cfg.trainer.checkpoint_every == 0:
            self._spend_rl_time(state)
            self.last_ckpt = self._checkpoint(state)
        return None

    def plateau_reached(self, state: TrainerState) -> bool:
        """After a step: has the run reached its plateau (``trainer.plateau_patience``)?"""
        reward = self.last_row["reward"]
        if math.isnan(reward) or not self.plateau.reached(reward, state):  # nan: nothing trained (all aborted)
            return False
        log.info("plateau at step %d: the batch reward's %d-step mean last gained %s at step %d",
                 state.step, self.plateau.window, self.cfg.trainer.plateau_min_delta, self.plateau.best_step)
        return True

    def close_run(self, state: TrainerState, evals: dict[str, dict[str, float]], ok: bool, stop_reason: str) -> float:
        """The end of the RL phase: the final evaluation and checkpoint (when ``ok``), the ``end``
        event; closes the metrics sink. Returns the RL seconds (resumed runs included).

        A run stopped by a guard (a non-finite loss, the collapse guard) hands back its last good
        checkpoint, not the weights it stopped with: those are loaded into ``self.model`` and
        evaluated as ``after_rl`` (the event's ``step`` is the checkpoint's, ``checkpoint_step``
        says so), so a stopped run still reports where RL left the model it keeps.
        """
        self._spend_rl_time(state)
        self._settle_marks()
        if ok:
            ev = self.evaluate("after_rl", state.step)
            if ev:
                evals["after_rl"] = ev
            state.extra["evals"] = evals
            self.last_ckpt = self._checkpoint(state)
        elif self.last_ckpt is not None and self.held_out is not None:
            step = int(Path(self.last_ckpt).name.removeprefix("step_"))
            log.warning("the run stopped at step %d (%s); its result is the last good checkpoint %s: evaluating that",
                        state.step, stop_reason, self.last_ckpt)
            load_weights(self.last_ckpt, self.model)
            ev = self.evaluate("after_rl", step, checkpoint_step=step)
            if ev:
                evals["after_rl"] = ev
        self.metrics.event("end", step=state.step, reason=stop_reason, lag_histogram=self.guards.histogram())
        self.metrics.close()
        return state.rl_elapsed_s

    def _on_batch_done(self, k: int) -> None:
        with self._ready:
            self._batches_done = max(self._batches_done, k) if k >= 0 else self._batches_done
            self._ready.notify_all()

    def _start_rollout(self, first_batch: int) -> RolloutThread | RolloutProcess:
        """Start the rollout beside this learner at batch ``first_batch``: a thread here
        (``trainer.backend=local``), or the child process spawned by :meth:`_build`, which has its
        own interpreter (``process``, :mod:`trainer.rollout_process`)."""
        cfg = self.cfg
        if self.rollout_process is not None:
            self.rollout_process.begin(first_batch)
            return self.rollout_process
        thread = RolloutThread(
            schedule=self.schedule,
            first_batch=first_batch,
            last_batch=cfg.trainer.steps,
            board=self.board,
            ledger=self.ledger,
            set_weights=self.runner.set_weights,
            run_episode=self.runner.run,
            concurrency=cfg.rollout.concurrency,
            on_batch_done=self._on_batch_done,
            on_episode_done=self.hooks.episode_done,
        )
        thread.start()
        return thread

    def _wait_batch(self, k: int, rollout: RolloutThread | RolloutProcess, deadline: float) -> bool:
        """Wait until batch ``k`` is complete; False when the time budget has run out (checked
        first: a learner that always finds its batch ready must stop on time too)."""
        if time.monotonic() > deadline:
            return False
        self.hooks.waiting(True)
        try:
            with self._ready:
                while self._batches_done < k:
                    if rollout.error is not None:
                        raise RuntimeError(f"rollout failed: {rollout.error!r}") from rollout.error
                    if not rollout.is_alive() and self._batches_done < k:
                        raise RuntimeError(f"rollout ({self.cfg.trainer.backend}) ended before producing the batch")
                    if time.monotonic() > deadline:
                        return False
                    self._ready.wait(timeout=0.5)
            return True
        finally:
            self.hooks.waiting(False)

    def run(self, *, resume: bool = False) -> TrainResult:
        try:
            return self._run(resume)
        finally:
            self.hooks.run_ended()

    def _run(self, resume: bool) -> TrainResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        try:
            state, evals = self.open_run(resume)
        except BaseException:  # the rollout process (if any) was spawned by the build: stop it
            if self.rollout_process is not None:
                self.rollout_process.join(timeout=10)
            raise
        deadline = self.rl_deadline(state)
        self._batches_done = state.step - 1
        rollout = self._start_rollout(state.step)
        self.hooks.rollout_started(rollout)
        stop_reason, ok = "steps", True
        try:
            # RL only: the warm start and the evaluations are not pinned
            with pinned(self.cpus[0] if self.cpus else None), freeze_gc(cfg):
                while state.step < cfg.trainer.steps:
                    if not self._wait_batch(state.step, rollout, deadline):
                        stop_reason = "time budget"
                        break
                    failed = self.learn(state.step, state)
                    if failed:
                        stop_reason, ok = failed, False
                        break
                    if self.plateau_reached(state):
                        stop_reason = "plateau"
                        break
        finally:
            self.board.stop()
            rollout.join(timeout=60)
        rl_elapsed = self.close_run(state, evals, ok, stop_reason)
        self.rollout_side.close()
        wall = time.perf_counter() - t0
        return TrainResult(ok, self.run_dir, state.step, stop_reason, wall, rl_elapsed, evals, self.last_ckpt)


def tree_metrics(batch: Any, trees: BatchTrees) -> dict[str, float]:
    """The tree figures of one step: leaves grown per episode tree, leaves trained on (rows) and
    the sampled leaves they stand for (``samples``: merged identical siblings count each), leaves
    merged/pruned, leaves scored by partial progress, the mean reward of the leaves trained on as
    the learner saw it (``learner_reward``: the partial score of a cut leaf with
    ``rollout.reward: partial``, where the step's ``reward`` is the env's), and the batch's sharing
    ratio (logical tokens over the tokens a packed forward holds; 1.0 for a flat batch without
    sharing); ``aborted`` (leaves of the batch's episodes whose grading could not happen, every
    attempt counted; never trained on), ``aborted_episodes`` (episodes every attempt of which
    aborted) and, when there were any, ``abort_reasons`` (reason -> leaves)."""
    aborted = {"aborted": float(trees.aborted), "aborted_episodes": float(trees.aborted_episodes)}
    if trees.abort_reasons:
        aborted["abort_reasons"] = dict(trees.abort_reasons)  # type: ignore[assignment]
    if batch is None:  # nothing to train on: every episode aborted
        return {"leaves_per_tree": 0.0, "leaves": 0.0, "samples": 0.0, "merged": 0.0, "pruned": 0.0,
                "partial_scored": 0.0, "learner_reward": float("nan"), "sharing_ratio": 1.0, **aborted}
    flat = batch.flat if hasattr(batch, "flat") else batch
    logical = float(flat.lengths.sum())
    stored = float(batch.num_tokens) if hasattr(batch, "num_tokens") else logical
    return {
        "leaves_per_tree": trees.leaves_per_tree,
        "leaves": float(len(flat.leaf_ids)),
        "samples": float(trees.samples),
        "merged": float(trees.merged),
        "pruned": float(trees.merged + trees.capped),
        "partial_scored": float(trees.partial_scored),
        "learner_reward": float(flat.rewards.float().mean()) if len(flat.leaf_ids) else float("nan"),
        "sharing_ratio": logical / max(1.0, stored),
        **aborted,
    }


def run_training(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, console: bool = True) -> TrainResult:
    """Train ``cfg`` in ``run_dir`` (``resume``: continue from its latest checkpoint)."""
    return Trainer(cfg, run_dir, console=console).run(resume=resume)
