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

The schedule (:mod:`trainer.batches`) fixes which episodes form batch ``k`` and which policy
version samples them, so rollout can run up to ``max_policy_lag`` batches ahead of the learner
(that is the admission control: an episode starts only when its trajectory will be at most
``max_policy_lag`` versions old when consumed) while the data stays independent of thread timing.
Finished work is never discarded; every batch is consumed exactly once, in order.

The two sides (:mod:`trainer.parts`) stay whole: ``trainer.learner_side``, ``trainer.rollout_side``.
Batches follow one path (:mod:`trainer.batches`), every backend runs one batch loop
(:mod:`trainer.rollout_batch`), and a run is extended by a list of hooks (:class:`TrainerHooks`, below;
the elastic runtime is one).

Stops: ``trainer.steps`` reached, ``trainer.max_minutes`` elapsed (or the next step, expected to take
what the last one took, would end past it: a step is never cut once started), a non-finite loss (the
batch is saved to ``RUN_DIR/nan_batch_step<k>.pt``), or the collapse guard (batch reward below half
its start); after a guard the run's result is its last good checkpoint, evaluated as ``after_rl``.

Also here, the pieces only the loop uses: :func:`before_rl` (a new run's set-up: the held-out
figures before, the warm start, the figures after; a resumed run skips it, its checkpoint holds
those evaluations), :func:`evaluate_held_out` (one held-out evaluation, logged as an ``eval``
event and a log line), :class:`RLClock` (the seconds a run spends learning, across resumes: set-up
is not RL time; a checkpoint and the run's end add the seconds since the last of them to
``TrainerState.rl_elapsed_s``, so ``trainer.max_minutes`` counts a resumed run's earlier lives too)
and :class:`TrainResult` (what a run did, returned by every backend).

**``fr-agents train``** (:func:`main_train`): resolve the config, check everything, then hand over to
the loop. Order of business, so that a mistake costs seconds, not a warm start:

1. load the preset or YAML and apply the ``key=value`` overrides (an invalid key is a
   :class:`~fr_agents.config.ConfigError` naming it);
2. ``--dry-run``: print the resolved config, the checks and the placement plan and return; the exit
   code is the real run's verdict (0: it would start, 2: a check fails, as a real run's config error);
3. preflight: the model, the env id (registered and importable), the task source, the device;
4. create the run directory (or reopen it with ``--resume``) and run :class:`Trainer`
   (with :class:`~trainer.elastic.runtime.ElasticHooks` under ``trainer.elastic=true``), or the
   Ray backend (:func:`trainer.ray_backend.run_training_ray`).

**Hooks** (:class:`TrainerHooks`): how a run is extended without touching its parts' methods. A
:class:`Trainer` takes a :class:`TrainerHooks` object, or a list of them, and calls them at fixed points;
every hook does nothing by default, so a subclass overrides only what it
needs. A hooks object extends a plain ``Trainer``: nothing subclasses the trainer itself. A list
composes (:class:`HookList`), as gymnasium's wrappers and TRL's callbacks do: each hook runs in list
order, ``engine`` wraps the engine the previous hook returned, ``around_step`` nests (the first hook
outermost), and ``run_ended`` runs in reverse order, every one of them even when one raises. The
elastic runtime (:class:`~trainer.elastic.runtime.ElasticHooks`) is the example: it hands the
episode runner an :class:`~trainer.elastic.pools.ElasticPool` instead of the plain engine
(:meth:`engine`), counts finished episodes (:meth:`episode_done`), sizes each learner step to its
train pool (:meth:`around_step`, :meth:`before_micro_batch`) and watches the learner wait
(:meth:`waiting`). Nobody reassigns a method of another object. :meth:`engine` and
:meth:`episode_done` act inside the rollout, so they need it in the learner's process
(``trainer.backend=local``); the trainer refuses them with ``process``.

When each hook runs::

    build:   engine(base, tokenizer)            once, when the rollout side is built
    start:   run_started(trainer)               the parts exist, before the warm start
             rollout_started(rollout)           the rollout (thread or process) runs
    loop:    waiting(True) ... waiting(False)   the learner waits for batch k
             around_step(step)                  wraps one learner step (call step() once)
             before_micro_batch()               inside the step, before each micro-batch
             episode_done(outcome)              rollout thread, each finished episode
    end:     run_ended()                        always, also after an error
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

from fr_agents.config import ConfigError, TrainConfig, dump_config, load_config
from fr_agents.run_layout import CHECKPOINT_DIR, CONFIG_FILE
from fr_agents.tree.batch import flat_view
from trainer.batches import ConsumedMarks, export_batch, save_bad_batch
from trainer.checkpoint import TrainerState, checkpoint_run, latest_checkpoint, load_weights, resume_run
from trainer.guards import Guards, Plateau
from trainer.metrics import step_row
from trainer.os_tuning import (
    cpu_split,
    freeze_gc,
    pinned,
    release_freed_memory,
    rollout_threads,
    warm_start_cores,
    why_not_pinned,
)
from trainer.parts import LearnerSide, RolloutSide, build_learner_side, build_rollout_side
from trainer.rollout_process import RolloutProcess
from trainer.rollout_thread import ReadyBatches, Rollout, RolloutThread

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from fr_agents.policy.base import Engine
    from trainer.episodes import EpisodeOutcome
    from trainer.loop import Trainer
    from trainer.rollout_thread import Rollout


log = logging.getLogger(__name__)


class Trainer:
    """One run: builds both sides from a config and drives rollout + learning (see module doc).
    ``hooks``: a :class:`~trainer.loop.TrainerHooks`, or a list of them (they compose)."""

    learner_side: LearnerSide  # both set by build()
    rollout_side: RolloutSide

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        *,
        console: bool = True,
        hooks: TrainerHooks | Sequence[TrainerHooks] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.hooks = as_hooks(hooks)
        self.rollout_process: RolloutProcess | None = None  # trainer.backend=process: spawned by build()
        self.cpus: tuple[list[int], list[int]] | None = (
            None  # trainer.pin_cpus: (learner, rollout) CPUs, by build()
        )
        refuse_rollout_hooks(self.hooks, cfg.trainer.backend)
        self.lag = cfg.rollout.max_policy_lag
        self.guards = Guards(self.lag, cfg.trainer.collapse_guard)
        self.plateau = Plateau(
            cfg.trainer.plateau_patience, cfg.trainer.plateau_window, cfg.trainer.plateau_min_delta
        )
        self.ready = ReadyBatches(cfg.trainer.backend)

    # the parts read most, read through the sides (nothing is copied onto the trainer)
    learner = property(attrgetter("learner_side.learner"), doc="The learner side's ``Learner``.")
    board = property(attrgetter("learner_side.board"), doc="The learner side's ``WeightBoard``.")
    runner = property(attrgetter("rollout_side.runner"), doc="The rollout side's ``EpisodeRunner``.")
    model = property(attrgetter("learner_side.model"), doc="The learner side's policy model.")

    def build(self) -> None:
        """The learner side, then the rollout side (its runner samples with the learner's model's
        copy; with ``trainer.backend=process`` it only encodes and records, and the rollout
        process is spawned now: it builds its own side while this one evaluates and warm starts)."""
        cfg = self.cfg
        self.learner_side = build_learner_side(
            cfg, self.run_dir, console=self.console, before_micro_batch=self.hooks.before_micro_batch
        )
        self.rollout_side = build_rollout_side(
            cfg,
            self.run_dir,
            tokenizer=self.learner_side.tokenizer,
            engine_model=self.model,
            with_engine=cfg.trainer.backend == "local",
            engine=self.hooks.engine,
        )
        self.marks = ConsumedMarks(self.rollout_side.tree)
        self.cpus = cpu_split(cfg)  # (learner, rollout) CPUs with trainer.pin_cpus
        if why := why_not_pinned(cfg):
            log.warning("trainer.pin_cpus: nothing is pinned: %s", why)
        if cfg.trainer.backend == "process":
            self.rollout_process = RolloutProcess(
                cfg=cfg,
                run_dir=self.run_dir,
                last_batch=cfg.trainer.steps,
                board=self.board,
                on_batch_done=self.ready.done,
                threads=rollout_threads(cfg),
                cpus=self.cpus[1] if self.cpus else None,
            )
            self.rollout_process.start()

    def _checkpoint(self, state: TrainerState) -> Path:
        self.marks.settle()  # the checkpoint stores the store's cursor: every consumed batch in it
        return checkpoint_run(
            self.run_dir,
            self.learner_side,
            state,
            tree=self.rollout_side.tree,
            lag=self.lag,
            lag_histogram=self.guards.histogram(),
            keep=self.cfg.trainer.keep_checkpoints,
        )

    def open_run(self, resume: bool) -> tuple[TrainerState, dict[str, dict[str, float]]]:
        """Build the parts; restore the latest checkpoint (``resume``) or run :func:`~trainer.loop.before_rl`;
        publish version ``learner.version``. First of all, a recipe tuned for another kind of model
        is logged (:func:`trainer.preflight.warn_recipe`) and kept in the ``start`` event."""
        from trainer.preflight import warn_recipe

        cfg = self.cfg
        recipe = warn_recipe(cfg)
        self.build()
        self.hooks.run_started(self)
        ls, rs = self.learner_side, self.rollout_side
        where = "process" if cfg.trainer.backend == "process" else "workers"
        engine = (
            type(rs.runner.engine).__name__
            if rs.runner.engine is not None
            else f"{cfg.rollout.engine} (rollout {where})"
        )
        ls.metrics.event(
            "start",
            engine=engine,
            backend=cfg.trainer.backend,
            resume=resume,
            **({"recipe_warning": recipe} if recipe else {}),
        )
        state = TrainerState()
        if resume:
            state, ckpt = resume_run(self.run_dir, ls, tree=rs.tree)
            self.guards.restore(state.extra.get("lag_histogram", {}))
            self.plateau.restore(state.extra.get("plateau"))
            evals = dict(state.extra.get("evals", {}))
            log.info(
                "resumed from %s at step %d (open episodes in the store: %d)",
                ckpt,
                state.step,
                len(rs.tree.open_paths()),
            )
        else:
            evals = before_rl(cfg, ls, rs, state, self.run_dir)
        self.board.publish(self.learner.version, ls.model)
        self.last_ckpt = self._checkpoint(state) if not resume else latest_checkpoint(self.run_dir)
        if self.rollout_process is not None:  # set-up, not RL time (it overlapped the warm start, if any)
            self.rollout_process.wait_ready()
            ls.metrics.event("rollout", backend=cfg.trainer.backend, **self.rollout_process.info)
        self.clock = RLClock()
        return state, evals

    def learn(self, k: int, state: TrainerState) -> str | None:
        """Step ``k`` on the complete batch ``k``: export it, one optimizer step, publish version
        ``k + 1``, metrics (``self.last_row``), evaluations, guards, checkpoint. Returns ``None``
        to go on, or why the run must stop (a non-finite loss, the collapse guard)."""
        from trainer.learner import NonFiniteLossError

        cfg, ls, rs = self.cfg, self.learner_side, self.rollout_side
        batch, leaves, rows, trees = export_batch(k, cfg, rs.schedule, rs.ledger, rs.tree)
        flat = flat_view(batch) if batch is not None else None
        try:
            if batch is None:  # every episode of batch k aborted: the version advances, nothing is learnt
                stats = {"loss": float("nan"), **ls.learner.skip_step()}
            else:
                began = time.monotonic()
                stats = self.hooks.around_step(lambda: ls.learner.step(batch))
                self.clock.step_s = time.monotonic() - began
        except NonFiniteLossError as e:
            path = save_bad_batch(self.run_dir, k, batch, leaves, e)
            log.error(
                "non-finite loss at step %d: %s; batch saved to %s; last good checkpoint %s",
                k,
                e,
                path,
                self.last_ckpt,
            )
            ls.metrics.event("stop", step=k, reason="non-finite loss", batch_file=str(path))
            return "non-finite loss"
        # the new weights first: the rollout may be waiting for them to start its next batch
        ls.board.publish(ls.learner.version, ls.model)
        if leaves:
            self.marks.add(sorted(set(leaves)))
        state.step = k + 1
        ls.board.drop_below(max(0, state.step - self.lag))
        row = step_row(
            state.step,
            ls.learner.version,
            stats,
            rows,
            self.guards.lags(flat, k) if flat is not None else [],
            batch,
            trees,
            seconds=self.clock.lap(),
            elapsed_s=self.clock.elapsed(state),
            sampled=rs.ledger.sampled_tokens(k),
        )
        self.last_row = row
        ls.metrics.step(row)
        spent = self.clock.spent(state, cfg.trainer.max_minutes)
        if cfg.trainer.eval_every and state.step % cfg.trainer.eval_every == 0:
            # the held-out evaluation after RL follows at once, at these weights, on the same games and more
            if spent or state.step >= cfg.trainer.steps:
                log.info(
                    "%s at step %d: its periodic evaluation is left to the one after RL",
                    "RL budget spent" if spent else "last step",
                    state.step,
                )
            else:
                evaluate_held_out(ls, "during", state.step, during=True)
        if not spent and ls.periodic is not None and ls.periodic.due(state.step):
            ls.metrics.event("eval_at_k", **ls.periodic.run(state.step, ls.model, ls.tokenizer))
        if rows and self.guards.collapsed(row["reward"], state):
            reason = "collapse guard (batch reward fell below half its start)"
            log.error("%s at step %d; last good checkpoint %s", reason, state.step, self.last_ckpt)
            ls.metrics.event("stop", step=state.step, reason=reason)
            return reason
        if cfg.trainer.checkpoint_every and state.step % cfg.trainer.checkpoint_every == 0:
            self.clock.spend(state)
            self.last_ckpt = self._checkpoint(state)
        return None

    def plateau_reached(self, state: TrainerState) -> bool:
        """After a step: has the run reached its plateau (``trainer.plateau_patience``)?"""
        reward = self.last_row["reward"]
        if math.isnan(reward) or not self.plateau.reached(
            reward, state
        ):  # nan: nothing trained (all aborted)
            return False
        log.info(
            "plateau at step %d: the batch reward's %d-step mean last gained %s at step %d",
            state.step,
            self.plateau.window,
            self.cfg.trainer.plateau_min_delta,
            self.plateau.best_step,
        )
        return True

    def close_run(
        self, state: TrainerState, evals: dict[str, dict[str, float]], ok: bool, stop_reason: str
    ) -> float:
        """The end of the RL phase: the final evaluation and checkpoint (when ``ok``; a run stopped
        by a guard evaluates its last good checkpoint instead: :func:`~trainer.loop.evaluate_kept`),
        the ``end`` event; closes the metrics sink. Returns the RL seconds (resumed runs included)."""
        self.clock.spend(state)
        self.marks.settle()
        ls = self.learner_side
        if ok:
            if ev := evaluate_held_out(ls, "after_rl", state.step):
                evals["after_rl"] = ev
            state.extra["evals"] = evals
            self.last_ckpt = self._checkpoint(state)
        elif self.last_ckpt is not None and (
            ev := evaluate_kept(ls, Path(self.last_ckpt), state.step, stop_reason)
        ):
            evals["after_rl"] = ev
        ls.metrics.event("end", step=state.step, reason=stop_reason, lag_histogram=self.guards.histogram())
        ls.metrics.close()
        return state.rl_elapsed_s

    def start_rollout(self, first_batch: int) -> Rollout:
        """Start the rollout beside this learner at batch ``first_batch``: a thread here
        (``trainer.backend=local``) or the child process spawned by :meth:`build` (``process``,
        :mod:`trainer.rollout_process`)."""
        self.ready.last_done = first_batch - 1
        if self.rollout_process is not None:
            self.rollout_process.begin(first_batch)
            return self.rollout_process
        return RolloutThread.beside(
            self.rollout_side,
            first_batch=first_batch,
            last_batch=self.cfg.trainer.steps,
            board=self.board,
            concurrency=self.cfg.rollout.concurrency,
            on_batch_done=self.ready.done,
            on_episode_done=self.hooks.episode_done,
        )

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
        deadline = self.clock.deadline(state, cfg.trainer.max_minutes)
        rollout = self.start_rollout(state.step)
        self.hooks.rollout_started(rollout)
        stop_reason, ok = "steps", True
        try:
            # RL only: the warm start and the evaluations are not pinned
            with pinned(self.cpus[0] if self.cpus else None), freeze_gc(cfg):
                while state.step < cfg.trainer.steps:
                    if not self.ready.wait(state.step, rollout, deadline, waiting=self.hooks.waiting):
                        stop_reason = "time budget"
                        break
                    if not self.clock.fits(deadline):
                        log.info(
                            "RL budget: step %d would end %.0f s past it (the last step took %.0f s); "
                            "not started, its batch stays in the store",
                            state.step + 1,
                            time.monotonic() + self.clock.step_s - deadline,
                            self.clock.step_s,
                        )
                        stop_reason = "time budget"
                        break
                    if failed := self.learn(state.step, state):
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
        return TrainResult(
            ok,
            self.run_dir,
            state.step,
            stop_reason,
            time.perf_counter() - t0,
            rl_elapsed,
            evals,
            self.last_ckpt,
        )


def run_training(
    cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False, console: bool = True
) -> TrainResult:
    """Train ``cfg`` in ``run_dir`` (``resume``: continue from its latest checkpoint)."""
    return Trainer(cfg, run_dir, console=console).run(resume=resume)


# =========================================================================== held-out evaluations


def evaluate_held_out(
    side: LearnerSide,
    name: str,
    step: int,
    *,
    during: bool = False,
    **extra: int,
) -> dict[str, float] | None:
    """Greedy held-out figures of ``side``'s model now (:class:`~trainer.evaluate.HeldOutEval`; ``during``:
    one of the evaluations every ``trainer.eval_every`` steps, on ``trainer.eval_during_episodes``
    of the problems), logged as an ``eval`` event with ``extra`` fields; None when
    ``trainer.eval_episodes`` is 0."""
    if side.held_out is None:
        return None
    res = {**side.held_out.run(name, step, side.model, side.tokenizer, during=during), **extra}
    release_freed_memory()  # the evaluation's engine (its cache, its kept rows) is gone: hand its heap back
    side.metrics.event("eval", **res, name=name, step=step)
    log.info(
        "held-out %s (step %d): success %.1f%%, reward %.3f, %.1f turns, %.1f "
        "tool calls (%d episodes, %.1fs)",
        name,
        step,
        100 * res["success"],
        res["reward"],
        res["turns"],
        res["tool_calls"],
        res["episodes"],
        res["seconds"],
    )
    if by_group := res.get("by_group"):
        log.info(
            "held-out %s by group: %s",
            name,
            ", ".join(f"{g} {100 * m['success']:.0f}% of {m['tasks']}" for g, m in by_group.items()),
        )
    return res


def evaluate_kept(
    side: LearnerSide, checkpoint: Path, stopped_at: int, reason: str
) -> dict[str, float] | None:
    """A run stopped by a guard (a non-finite loss, the collapse guard) hands back its last good
    ``checkpoint``, not the weights it stopped with at step ``stopped_at``: those are loaded into
    ``side.model`` and evaluated as ``after_rl`` (the event's ``step`` is the checkpoint's,
    ``checkpoint_step`` says so), so a stopped run still reports where RL left the model it keeps.
    None when nothing is evaluated held out."""
    if side.held_out is None:
        return None
    step = int(checkpoint.name.removeprefix("step_"))
    log.warning(
        "the run stopped at step %d (%s); its result is the last good checkpoint %s: evaluating that",
        stopped_at,
        reason,
        checkpoint,
    )
    load_weights(checkpoint, side.model)
    return evaluate_held_out(side, "after_rl", step, checkpoint_step=step)


# =========================================================================== before RL


def before_rl(
    cfg: TrainConfig, learner: LearnerSide, rollout: RolloutSide, state: TrainerState, run_dir: Path
) -> dict[str, dict[str, float]]:
    """Evaluate held out (``before``, unless ``trainer.eval_before`` is false), warm start on
    ``warm_start.examples`` demos (every core this process may use: nothing runs beside it),
    evaluate again (``after_warm_start``). Returns the evaluations, also kept in
    ``state.extra["evals"]`` for the checkpoint."""
    from trainer.warm_start import run_warm_start

    evals: dict[str, dict[str, float]] = {}
    if cfg.trainer.eval_before and (ev := evaluate_held_out(learner, "before", 0)):
        evals["before"] = ev
    if cfg.warm_start.examples > 0:
        with warm_start_cores():  # supervised steps with nothing beside them
            run_warm_start(
                cfg, learner.model, rollout.runner, rollout.demo_tasks, learner.metrics, state, run_dir
            )
        release_freed_memory()
        if ev := evaluate_held_out(learner, "after_warm_start", 0):
            evals["after_warm_start"] = ev
    state.extra["evals"] = evals
    return evals


# =========================================================================== the RL clock


class RLClock:
    """Starts when RL starts; see the module docstring."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last_step_end = time.perf_counter()
        self.step_s = 0.0  # the last learner step's seconds, its hooks included: the next one's expected time

    def fits(self, deadline: float) -> bool:
        """Whether a step started now is expected to end by ``deadline`` (it takes what the last one
        took; the first step always starts). A step is not cut once started, so without this an
        ALFWorld step of ~4 min that starts a minute before the budget ends 3 min past it."""
        return time.monotonic() + self.step_s <= deadline

    def deadline(self, state: TrainerState, max_minutes: float) -> float:
        """``time.monotonic()`` at which ``max_minutes`` of RL (resumed runs included) are spent
        (``math.inf`` when ``max_minutes`` is 0: no budget)."""
        budget = max_minutes * 60 - state.rl_elapsed_s if max_minutes > 0 else math.inf
        return self.started + budget

    def spend(self, state: TrainerState) -> None:
        """Add the RL seconds since the last call (or the start) to ``state``."""
        state.rl_elapsed_s += time.monotonic() - self.started
        self.started = time.monotonic()

    def elapsed(self, state: TrainerState) -> float:
        """RL seconds so far, resumed runs included."""
        return state.rl_elapsed_s + (time.monotonic() - self.started)

    def spent(self, state: TrainerState, max_minutes: float) -> bool:
        """Whether ``max_minutes`` of RL (resumed runs included) are spent: a step that ends past the
        budget runs no periodic evaluation (a 32-game ALFWorld one took 5 min past a 20-min budget)."""
        return time.monotonic() >= self.deadline(state, max_minutes)

    def lap(self) -> float:
        """Seconds since the previous step ended (or the start): this step's share of the wall."""
        now = time.perf_counter()
        seconds, self.last_step_end = now - self.last_step_end, now
        return seconds


# =========================================================================== the run's result


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
        lines = [
            f"run {self.run_dir}: {self.steps} steps, stopped: "
            f"{self.stop_reason}, wall {self.wall_s:.0f}s (RL {self.rl_s:.0f}s)"
        ]
        for name, ev in self.evals.items():
            per_episode = (
                f", {ev['turns']:.1f} turns, {ev['tool_calls']:.1f} tool calls" if "turns" in ev else ""
            )
            kept = (
                f", the last good checkpoint (step {ev['checkpoint_step']})"
                if "checkpoint_step" in ev
                else ""
            )
            lines.append(
                f"  held-out success {name}: {100 * ev['success']:.1f}% ({int(ev['episodes'])} tasks, "
                f"reward {ev['reward']:.3f}{per_episode}{kept})"
            )
        if self.last_checkpoint:
            lines.append(f"  last checkpoint: {self.last_checkpoint}")
        return "\n".join(lines)


# =========================================================================== fr-agents train: main_train


def resolve_run_dir(cfg: TrainConfig, run_dir: str | None) -> Path:
    if run_dir:
        return Path(run_dir)
    name = cfg.run.name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.out_dir) / name


ENV_PRESET = "env-tiny"
"""The preset behind ``fr-agents train --env MODULE:ID``: the tiny model, tasks from the env's own
reset (``tasks.source=env-reset``), multi-turn episodes."""


def load_run_config(
    preset: str | None, overrides: list[str], resume: str | None, *, env: str | None = None
) -> TrainConfig:
    """The config of a new run, or of the run being resumed (with optional overrides on top).

    ``env``: train on that gymnasium id with the :data:`ENV_PRESET` defaults (``--env``).
    """
    if preset and "=" in preset:  # `fr-agents train key=value --resume DIR`
        overrides = [preset, *overrides]
        preset = None
    if env is not None:
        if preset or resume:
            raise ConfigError(
                "--env: give either --env MODULE:ID, a preset or --resume RUN_DIR, not two of them"
            )
        if not env.strip():
            raise ConfigError("--env: expected a gymnasium id such as mypkg.envs:me/Guess-v0")
        return load_config(ENV_PRESET, [f"env.id={env}", *overrides])
    if resume:
        saved = Path(resume) / CONFIG_FILE
        if not saved.exists():
            raise ConfigError(f"--resume: {resume} has no {CONFIG_FILE} (not a run directory)")
        if preset:
            raise ConfigError("--resume: give either a preset or --resume RUN_DIR, not both")
        return load_config(str(saved), overrides)
    return load_config(preset or "math-tiny", overrides)


def main_train(
    preset: str | None,
    overrides: list[str] | None = None,
    *,
    resume: str | None = None,
    dry_run: bool = False,
    run_dir: str | None = None,
    env: str | None = None,
) -> int:
    """The ``fr-agents train`` command. Returns the process exit code."""
    cfg = load_run_config(preset, list(overrides or []), resume, env=env)
    from trainer.os_tuning import onednn_cache_capacity

    onednn_cache_capacity(cfg)  # before any product of this process, and inherited by the ones it starts
    from trainer.preflight import dry_run_report, run_preflight

    if dry_run:
        pf = run_preflight(cfg, import_env=False)
        print(dry_run_report(cfg, pf))
        return 0 if pf.ok else 2
    run_preflight(cfg).raise_if_failed()
    if resume:
        out = Path(resume)
    else:
        out = resolve_run_dir(cfg, run_dir)
        if (out / CHECKPOINT_DIR).exists() and any((out / CHECKPOINT_DIR).iterdir()):
            raise ConfigError(f"run directory {out} already holds a run; use --resume {out} to continue it")
        out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / CONFIG_FILE)
    if cfg.trainer.backend == "ray":
        from trainer.ray_backend import run_training_ray

        result = run_training_ray(cfg, out, resume=bool(resume))
    else:
        from trainer.loop import Trainer

        hooks: list[TrainerHooks] = []
        if cfg.trainer.elastic:  # the elastic runtime: hooks on the plain trainer
            from trainer.elastic import ElasticHooks

            t = cfg.trainer
            hooks.append(ElasticHooks(cfg, devices=t.devices, rollout=t.rollout_devices or t.devices - 1))
        result = Trainer(cfg, out, console=True, hooks=hooks).run(resume=bool(resume))
    print(result.summary())
    return 0 if result.ok else 1


# =========================================================================== hooks: how a run is extended

ROLLOUT_HOOKS = ("engine", "episode_done")
"""The hooks that act inside the rollout, so they need it in the learner's process."""


class TrainerHooks:
    """Every hook of a run, each a no-op (see the module docstring)."""

    def engine(self, base: Engine, tokenizer: PreTrainedTokenizerBase) -> Engine:
        """The engine the episode runner samples with, given the one ``rollout.engine`` built."""
        return base

    def run_started(self, trainer: Trainer) -> None:
        """The run's parts are built (``trainer.learner_side``, ``trainer.rollout_side``; the parts
        read most also as ``trainer.learner``, ``trainer.board``, ``trainer.runner``, ``trainer.model``)."""

    def rollout_started(self, thread: Rollout) -> None:
        """The rollout (thread or process) started (``thread.next_batch``: the batch it works on)."""

    def waiting(self, waiting: bool) -> None:
        """The learner starts (True) or stops (False) waiting for its next batch."""

    def around_step(self, step: Callable[[], dict[str, float]]) -> dict[str, float]:
        """One learner step: call ``step()`` exactly once and return its stats."""
        return step()

    def before_micro_batch(self) -> None:
        """Inside a learner step, before each micro-batch (the Learner calls it)."""

    def episode_done(self, outcome: EpisodeOutcome) -> None:
        """The rollout thread finished and recorded one episode (its ``EpisodeOutcome``)."""

    def run_ended(self) -> None:
        """The run is over (also after an error): stop what the hooks started."""


def acts_inside_rollout(hooks: TrainerHooks) -> list[str]:
    """``Class.hook`` for each of :data:`ROLLOUT_HOOKS` that ``hooks`` (or a member of a
    :class:`HookList`) overrides."""
    members = hooks.hooks if isinstance(hooks, HookList) else [hooks]
    return [
        f"{type(h).__name__}.{name}"
        for h in members
        for name in ROLLOUT_HOOKS
        if getattr(type(h), name) is not getattr(TrainerHooks, name)
    ]


def refuse_rollout_hooks(hooks: TrainerHooks, backend: str) -> None:
    """Raise ConfigError when ``hooks`` act inside the rollout and ``backend`` runs it in a child
    process (``trainer.backend=process``)."""
    from fr_agents.config import ConfigError

    if backend == "process" and (inside := acts_inside_rollout(hooks)):
        raise ConfigError(
            f"trainer.backend: the hooks {'/'.join(inside)} act inside the rollout, "
            "which trainer.backend=process runs in a child process; use trainer.backend=local"
        )


class HookList(TrainerHooks):
    """Several hooks as one (see the module docstring for the order)."""

    def __init__(self, hooks: Sequence[TrainerHooks]) -> None:
        self.hooks = list(hooks)

    def engine(self, base: Engine, tokenizer: PreTrainedTokenizerBase) -> Engine:
        for h in self.hooks:
            base = h.engine(base, tokenizer)
        return base

    def run_started(self, trainer: Trainer) -> None:
        for h in self.hooks:
            h.run_started(trainer)

    def rollout_started(self, thread: Rollout) -> None:
        for h in self.hooks:
            h.rollout_started(thread)

    def waiting(self, waiting: bool) -> None:
        for h in self.hooks:
            h.waiting(waiting)

    def around_step(self, step: Callable[[], dict[str, float]]) -> dict[str, float]:
        wrapped = step
        for h in reversed(self.hooks):  # the first hook ends up outermost
            wrapped = (lambda hook, inner: lambda: hook.around_step(inner))(h, wrapped)
        return wrapped()

    def before_micro_batch(self) -> None:
        for h in self.hooks:
            h.before_micro_batch()

    def episode_done(self, outcome: EpisodeOutcome) -> None:
        for h in self.hooks:
            h.episode_done(outcome)

    def run_ended(self) -> None:
        errors = []
        for h in reversed(self.hooks):
            try:
                h.run_ended()
            except Exception as e:  # the others still stop what they started
                errors.append(e)
        if errors:
            raise errors[0]


def as_hooks(hooks: TrainerHooks | Sequence[TrainerHooks] | None) -> TrainerHooks:
    """One hooks object from what a Trainer was given: none, one, or a list (a :class:`HookList`)."""
    if hooks is None:
        return TrainerHooks()
    if isinstance(hooks, TrainerHooks):
        return hooks
    return HookList(hooks)
