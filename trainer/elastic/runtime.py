"""The embedded training loop on elastic device pools (CPU slots here, GPUs alike).

:class:`ElasticHooks` is a hooks object (:mod:`trainer.loop`) handed to a plain
:class:`trainer.loop.Trainer`, alone or in a list with others::

    elastic = ElasticHooks(cfg, devices=3, rollout=2)
    result = Trainer(cfg, run_dir, hooks=[elastic, ...]).run()
    elastic.pool_trace, elastic.step_seconds, elastic.cpu_seconds   # what it did

The engine hook hands the episode runner an
:class:`~trainer.elastic.pools.ElasticPool` of ``devices`` slots, each with its own engine (its own
model copy and batching thread). The learner runs on the train pool: each step uses
``torch.set_num_threads(train slots)`` (on CPU one slot = one core's worth of threads), and a
controller thread feeds telemetry to an :class:`~trainer.elastic.controller.ElasticController` every
``tick_s`` and applies its moves -- a slot leaving rollout drains without dropping an episode; a
slot joining rollout loads the current weights first, and only between two learner steps; a slot
joining the train pool during a step is used from the step's next micro-batch on (the learner's
``before_micro_batch`` hook raises its thread count). With ``elastic=False`` the split stays static.

Schedule, staleness bound, ledger, checkpoints: unchanged from the embedded loop.

``fr-agents train PRESET trainer.elastic=true [trainer.devices=3 trainer.rollout_devices=2]``
runs it (local backend, hf engine). A slot is a core's worth: the learner gets one torch thread
per train slot, but never more than the cores the serving slots leave free
(:meth:`ElasticHooks.learner_threads`) -- oversubscribed OpenMP threads made steps ~8x slower
here. ``cpu_seconds`` splits the run's CPU time into engines, learner steps, the learner thread's
other work and the host (the rest), which ``benchmarks/elastic_validation.py`` feeds to the
simulator.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fr_agents.config import TrainConfig
from trainer.elastic.controller import ControllerConfig, ElasticController, Telemetry, TelemetryWindow
from trainer.elastic.pools import DeviceState, ElasticPool
from trainer.loop import TrainerHooks

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from fr_agents.policy.hf import HFEngine
    from trainer.episodes import EpisodeOutcome
    from trainer.loop import Trainer
    from trainer.rollout_thread import Rollout

log = logging.getLogger(__name__)


def thread_cpu_seconds(native_ids: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) of this process's threads ``native_ids`` (``Thread.native_id``),
    read from ``/proc/self/task`` (Linux; threads that are gone or unreadable are left out)."""
    import os

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    for tid in native_ids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return out


class ElasticHooks(TrainerHooks):
    """See the module docstring; ``pool_trace`` records ``(t, rollout, train)`` after every change.

    The engine hook swaps in the pool, the step hooks size the learner to the train pool, and a
    controller thread (started with the run) moves slots between the two."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        devices: int,
        rollout: int,
        elastic: bool = True,
        controller: ControllerConfig | None = None,
        tick_s: float = 0.5,
        per_device_live: int | None = None,
    ) -> None:
        if not 1 <= rollout < devices:
            raise ValueError(f"rollout: must lie in [1, {devices - 1}], got {rollout}")
        self.cfg = cfg
        self.n_devices, self.n_rollout, self.elastic = devices, rollout, elastic
        self.controller = ElasticController(controller) if elastic else None
        self.tick_s = tick_s
        self.per_device_live = per_device_live or max(1, cfg.rollout.concurrency // rollout)
        self.window = TelemetryWindow(tau_s=4 * tick_s)
        self.pool_trace: list[tuple[float, int, int]] = []
        self.learner_waiting = False
        self.step_lock = threading.Lock()
        self.finished = 0
        self.consumed = 0
        self.trainer: Trainer | None = None  # the run, once started
        self.rollout_thread: Rollout | None = None
        self.step_seconds: list[tuple[int, float]] = []  # (train slots at the start, seconds)
        self.grown_steps = 0  # steps whose train pool grew while they ran
        self.step_slots: list[int] = []  # train slots of the running step, each time it grew
        self.step_cpu_seconds: list[tuple[int, float]] = []  # learner thread CPU per step
        # CPU seconds from the start of rollout to the end of the last learner step: the whole
        # process, the engines' batching threads, the learner's steps (host = the rest)
        self.cpu_seconds: dict[str, float] = {}
        self._stop = threading.Event()

    # ------------------------------------------------------------------ hooks (trainer.loop)

    def engine(self, base: HFEngine, tokenizer: PreTrainedTokenizerBase) -> ElasticPool:
        """The runner samples with an :class:`ElasticPool` of ``devices`` slot engines: ``base``
        and ``devices - 1`` copies of its model, the first ``rollout`` slots serving."""
        from fr_agents.policy.hf import HFEngine

        engines: dict[str, HFEngine] = {"cpu0": base}
        for i in range(1, self.n_devices):
            engines[f"cpu{i}"] = HFEngine(
                copy.deepcopy(base.model),  # base's model is already in rollout.dtype
                tokenizer,
                max_batch_size=base.max_batch_size,
                seed=self.cfg.trainer.seed + i,
                compact=self.cfg.model.compact_forward,
            )
        self.t0 = time.perf_counter()
        self.pool = ElasticPool(
            engines,
            rollout=[f"cpu{i}" for i in range(self.n_rollout)],
            max_live=self.per_device_live,
            saturation=base.max_batch_size,
            on_moved=lambda *_: self._record(),
        )
        return self.pool

    def run_started(self, trainer: Trainer) -> None:
        """The parts exist: start the CPU clocks and the controller thread."""
        self.trainer = trainer
        self.t0 = time.perf_counter()
        self._cpu0 = (time.process_time(), thread_cpu_seconds(self._engine_threads()), time.thread_time())
        self._record()
        self._controller = threading.Thread(target=self._control_loop, name="elastic-controller", daemon=True)
        self._controller.start()

    def rollout_started(self, thread: Rollout) -> None:
        self.rollout_thread = thread

    def waiting(self, waiting: bool) -> None:
        self.learner_waiting = waiting

    def episode_done(self, outcome: EpisodeOutcome) -> None:
        self.finished += 1

    def around_step(self, step: Callable[[], dict[str, float]]) -> dict[str, float]:
        """One learner step on the train pool: one torch thread per train slot (see
        :meth:`learner_threads`); moves to rollout wait for the step's end, so a step's pool only
        grows (:meth:`before_micro_batch`)."""
        with self.step_lock:
            n = len(self.pool.in_state(DeviceState.TRAIN))
            self.step_slots = [n]
            torch.set_num_threads(self.learner_threads(n))
            t, c = time.perf_counter(), time.thread_time()
            out = step()
            if len(self.step_slots) > 1:
                self.grown_steps += 1
            self.step_seconds.append((n, time.perf_counter() - t))
            self.step_cpu_seconds.append((n, time.thread_time() - c))
            self.consumed += self.cfg.trainer.batch_size
            self._cpu_mark()
            return out

    def before_micro_batch(self) -> None:
        self._grow_step()

    def _grow_step(self) -> None:
        """Before each micro-batch of a step: slots that joined the train pool since the step began
        (or since the last micro-batch) take part from here on -- the learner gets their threads."""
        n = len(self.pool.in_state(DeviceState.TRAIN))
        if self.step_slots and n > self.step_slots[-1]:
            self.step_slots.append(n)
            torch.set_num_threads(self.learner_threads(n))

    def run_ended(self) -> None:
        self._stop.set()
        if getattr(self, "_controller", None) is not None:
            self._controller.join(timeout=10)
        if getattr(self, "pool", None) is not None:
            self._record()

    # ------------------------------------------------------------------ accounting

    def _engine_threads(self) -> list[int]:
        """Native ids of the slots' engine batching threads (started lazily, on first request)."""
        out = []
        for d in self.pool.devices.values():
            th = getattr(d.engine, "_thread", None)
            if th is not None and th.native_id is not None:
                out.append(th.native_id)
        return out

    def _cpu_mark(self) -> None:
        proc0, eng0, main0 = self._cpu0
        eng = thread_cpu_seconds(self._engine_threads())
        self.cpu_seconds = {
            "process": time.process_time() - proc0,
            "engines": sum(v - eng0.get(tid, 0.0) for tid, v in eng.items()),
            "learner": sum(c for _, c in self.step_cpu_seconds),
            "main": time.thread_time() - main0,  # learner thread: steps + export/publish/metrics
            "episodes": float(self.finished),
            "steps": float(len(self.step_cpu_seconds)),
        }

    def learner_threads(self, train_slots: int) -> int:
        """Torch threads for a step on ``train_slots`` slots: one per slot, but never more than
        the cores the rollout slots leave free (at least one). More threads than free cores
        oversubscribes them -- measured here: 2 threads next to 2 decoding slots on 2 cores made
        a step ~8x slower than 1 thread."""
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        serving = len(self.pool.in_state(DeviceState.ROLLOUT, DeviceState.DRAINING))
        return max(1, min(train_slots, cores - serving))

    def _record(self) -> None:
        r = len(self.pool.in_state(DeviceState.ROLLOUT))
        k = len(self.pool.in_state(DeviceState.TRAIN))
        self.pool_trace.append((time.perf_counter() - self.t0, r, k))

    # ------------------------------------------------------------------ telemetry + control

    def telemetry(self) -> Telemetry:
        p, rt, tr = self.pool, self.rollout_thread, self.trainer
        assert tr is not None, "telemetry of a run that has not started"
        ahead = (rt.next_batch - 1 - tr.learner.version) if rt is not None else 0
        return Telemetry(
            time_s=time.perf_counter() - self.t0,
            rollout_devices=len(p.in_state(DeviceState.ROLLOUT)),
            train_devices=len(p.in_state(DeviceState.TRAIN)),
            moving=len(p.in_state(DeviceState.DRAINING, DeviceState.JOINING)),
            queue_depth=p.queue_depth,
            unconsumed=self.finished - self.consumed,
            batch_size=self.cfg.trainer.batch_size,
            learner_idle_frac=self.window.learner_idle,
            long_tail_frac=self.window.long_tail,
            staleness=ahead / tr.lag if tr.lag else 1.0,
            last_step_s=self.step_seconds[-1][1] if self.step_seconds else 0.0,
            finish_rate=self.window.finish_rate,
        )

    def _control_loop(self) -> None:
        last, seen = time.perf_counter(), self.finished
        while not self._stop.wait(self.tick_s / 5):
            now, done = time.perf_counter(), self.finished
            self.window.observe(
                now - last,
                self.learner_waiting,
                self.pool.idle_capacity_frac(),
                self.pool.queue_depth,
                done - seen,
            )
            last, seen = now, done
            if self.controller is None or self.trainer is None or self.trainer.board.stopped:
                continue
            if now - getattr(self, "_last_tick", 0.0) < self.tick_s:
                continue
            self._last_tick = now
            move = self.controller.decide(self.telemetry())
            if move is None:
                continue
            log.info("elastic: move %d to %s (%s)", move.count, move.to, move.reason)
            if move.to == "train":
                live = self.pool.live_counts()
                for name in sorted(self.pool.in_state(DeviceState.ROLLOUT), key=lambda n: live[n])[
                    : move.count
                ]:
                    self.pool.move_to_train(name)
            else:
                with self.step_lock:  # a step's device count is fixed while it runs
                    for name in self.pool.in_state(DeviceState.TRAIN)[: move.count]:
                        self.pool.move_to_rollout(name)
            self.window.reset()
            self._record()
