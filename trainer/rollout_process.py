"""``trainer.backend=process``: the embedded loop's rollout in a child process of its own.

The rollout thread (:mod:`trainer.rollout_thread`) and the learner share one interpreter, so
they share one GIL. On a small model both sides are mostly Python (the learner's module calls,
the rollout's engine waves, env steps, tree and ledger writes, asyncio); on 2 cores the learner
thread in one process with the rollout gets about half a core while it waits for the lock: the
loop is bound by the GIL, not by the cores. Here the same rollout code runs in a spawned child::

    learner process (main thread)                  rollout process (spawned, dies with its parent)
    ─────────────────────────────                  ────────────────────────────────────────────────
    WeightBoard.publish(v) ──── pipe: weights ───► its own WeightBoard ─► RolloutThread.run():
    WeightBoard.drop_below / stop ── pipe ───────►   the rollout side of the config (engine, envs,
    _on_batch_done(k) ◄──────── pipe: "done" k ───   tree and ledger writes), batch by batch
    rollout.error ◄───────────── pipe: "error" ───   (a failure, with its traceback)

Nothing else changes: the schedule, the admission rule (batch ``k`` samples with version
``k - max_policy_lag``), the ledger's acknowledgements and the tree's durable writes are the
thread's own code, run on the child's copy of the rollout side; the tree and the ledger are the
run directory's SQLite files (WAL), which both processes open. A version travels over the pipe as
one CPU buffer per dtype (:class:`~trainer.weights.FlatWeights`); torch moves each buffer to shared
memory, so a version is copied once, not per reader.

The child takes the cores the learner leaves (``cores - trainer.threads``, at least one torch
thread). It is killed by the kernel when the learner process dies (``PR_SET_PDEATHSIG``), as the
rollout thread dies with it, so a crash of the run leaves no rollout behind; what the ledger
acknowledged is on disk either way.

Hooks that act inside the rollout (:meth:`~trainer.loop.TrainerHooks.engine`,
:meth:`~trainer.loop.TrainerHooks.episode_done`) need the rollout in the learner's process
(``trainer.backend=local``); :class:`~trainer.loop.Trainer` refuses the combination.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch

    from fr_agents.config import TrainConfig
    from trainer.weights import FlatWeights, WeightBoard

    Weights: TypeAlias = FlatWeights | dict[str, torch.Tensor] | None  # a version as the board hands it on

log = logging.getLogger(__name__)


class RolloutProcessError(RuntimeError):
    """The rollout process failed; the message carries its traceback."""


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() == 1:  # the parent died before the request took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass


def _child_main(
    cfg: TrainConfig, run_dir: str, last_batch: int, conn: Connection, threads: int, cpus: list[int] | None
) -> None:
    """The rollout process: build the rollout side, wait for the first batch, then run the
    rollout thread's loop here (pinned to ``cpus`` from the start, when given: every thread and
    process it starts inherits them)."""
    _die_with_parent()
    if cpus:
        from trainer.os_tuning import pin_process

        pin_process(cpus)
    logging.basicConfig(level=os.environ.get("FR_AGENTS_LOG", "WARNING"))
    import torch

    from trainer.os_tuning import freeze_gc
    from trainer.parts import build_rollout_side
    from trainer.rollout_batch import BatchLoop
    from trainer.rollout_thread import RolloutThread
    from trainer.weights import WeightBoard

    torch.set_num_threads(max(1, threads))
    send_lock = threading.Lock()

    def send(*msg: object) -> None:
        with send_lock:
            conn.send(msg)

    board = WeightBoard()

    def receive() -> None:
        while True:
            try:
                event, version, weights = conn.recv()
            except (EOFError, OSError):
                board.stop()
                return
            if event == "publish":
                board.publish(version, weights, copy=False)
            elif event == "drop":
                board.drop_below(version)
            else:
                board.stop()
                return

    side = None
    try:
        side = build_rollout_side(cfg, run_dir)
        send("ready", {"engine": type(side.runner.engine).__name__, "pid": os.getpid()})
        try:
            event, first_batch, _ = conn.recv()  # ("begin", the first batch, None) once the learner is ready
        except (EOFError, OSError):
            return
        if event != "begin":
            return
        threading.Thread(target=receive, name="rollout-weights", daemon=True).start()

        def done(k: int) -> None:  # called inside rollout.run(); k = -1 after it set its error
            if k >= 0:
                send("done", k)
            else:
                send("error", "".join(traceback.format_exception(rollout.error)))

        batches = BatchLoop.of_side(
            side, concurrency=max(1, cfg.rollout.concurrency), stopped=lambda: board.stopped
        )
        rollout = RolloutThread(
            batches=batches, first_batch=first_batch, last_batch=last_batch, board=board, on_batch_done=done
        )
        with freeze_gc(cfg):
            rollout.run()  # this process's main thread runs the loop; errors are sent by done(-1)
    except BaseException as e:  # noqa: BLE001 - building the side failed: tell the learner
        send("error", "".join(traceback.format_exception(e)))
    finally:
        if side is not None:
            side.close()
        with contextlib.suppress(OSError, ValueError):
            send("exit", None)


class RolloutProcess:
    """The learner's handle on the rollout process; the surface of
    :class:`~trainer.rollout_thread.RolloutThread` that the loop uses (``start``, ``join``,
    ``is_alive``, ``error``, ``next_batch``).

    ``board``: the learner's weight board; every version published on it (and those it holds
    when the process starts) is sent to the child, and its ``drop_below``/``stop`` follow.
    ``on_batch_done(k)``: called from a reader thread when batch ``k`` is whole (``-1``: the
    process failed or ended early; see ``error``).
    ``threads``: torch threads of the child. ``cpus``: the CPUs the child is pinned to
    (``trainer.pin_cpus``; ``None``: not pinned).

    :meth:`start` spawns the child early (it builds its rollout side meanwhile); :meth:`wait_ready`
    waits for that; :meth:`begin` sets the first batch, once the learner knows it (after a resume,
    the checkpoint's step).
    """

    def __init__(
        self,
        *,
        cfg: TrainConfig,
        run_dir: str | Path,
        last_batch: int,
        board: WeightBoard,
        on_batch_done: Callable[[int], None],
        threads: int,
        cpus: list[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = str(run_dir)
        self.next_batch = 0
        self.last_batch = last_batch
        self.board = board
        self.on_batch_done = on_batch_done
        self.threads = threads
        self.cpus = cpus
        self.error: BaseException | None = None
        self._outbox: queue.SimpleQueue[tuple[str, int | None, Weights]] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._exited = threading.Event()
        self._ready = threading.Event()
        self.info: dict[str, Any] = {}  # from the child once ready: its engine's class name and pid
        self._stopping = False
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        """Spawn the child; it builds its rollout side (imports, tokenizer, engine) at once, so
        that this overlaps the learner's evaluations and warm start, then waits for :meth:`begin`."""
        ctx = multiprocessing.get_context("spawn")  # never fork a process that holds torch threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child_main,
            args=(self.cfg, self.run_dir, self.last_batch, child, self.threads, self.cpus),
            name="fr-rollout",
            daemon=True,
        )
        self._proc.start()
        child.close()
        threading.Thread(target=self._read, name="rollout-process-reader", daemon=True).start()
        self._sender = threading.Thread(target=self._send_all, name="rollout-process-sender", daemon=True)
        self._sender.start()

    def wait_ready(self) -> None:
        """Block until the child has built its rollout side; raises its error when it failed."""
        self._ready.wait()
        if self.error is not None:
            raise self.error
        if self._exited.is_set():
            raise RolloutProcessError(
                f"the rollout process ended (exit code {self._proc.exitcode}) while starting"
            )

    def begin(self, first_batch: int) -> None:
        """Start rolling out at batch ``first_batch``; from now on the board's versions are sent.
        With no batch left to roll out (``trainer.steps=0``, a finished run resumed) nothing is
        sent: weights handed to a child that stops at once would be torn down mid-transfer."""
        self.next_batch = first_batch
        if first_batch >= self.last_batch:
            return
        self._forward("begin", first_batch, None)
        self.board.add_listener(self._forward)

    def _forward(self, event: str, version: int | None, weights: Weights) -> None:
        """Queue a message for the child; the sender thread pickles and writes it, in order, so the
        learner's step does not wait for the pipe (a version's hand-off: ~3 ms of pickling and
        descriptor passing on the tiny model, beside the next step's torch work)."""
        self._outbox.put((event, version, weights))

    def _send_all(self) -> None:
        while True:
            event, version, weights = self._outbox.get()
            if not self._exited.is_set():
                try:
                    self._conn.send((event, version, weights))
                except (OSError, ValueError):  # the child is gone; the reader reports why
                    pass
                except Exception as e:  # noqa: BLE001 - the learner must hear of it, not wait forever
                    log.exception("rollout process: sending %s failed", event)
                    self.error = RolloutProcessError(f"sending {event} to the rollout process failed: {e!r}")
                    self.on_batch_done(-1)
            del weights  # a sent version is the board's (or nobody's) again
            if event == "stop":
                return

    def _read(self) -> None:
        try:
            while True:
                kind, value = self._conn.recv()
                if kind == "ready":
                    self.info = value
                    self._ready.set()
                elif kind == "done":
                    self.next_batch = value + 1
                    self.on_batch_done(value)
                elif kind == "error":
                    self.error = RolloutProcessError(f"the rollout process failed:\n{value}")
                    self.on_batch_done(-1)
                elif kind == "exit":
                    break
        except (EOFError, OSError):
            if not self._stopping and self.error is None and self.next_batch < self.last_batch:
                self.error = RolloutProcessError(
                    "the rollout process ended (exit code "
                    f"{self._proc.exitcode}) before batch {self.next_batch}"
                )
                self.on_batch_done(-1)
        finally:
            self._exited.set()
            self._ready.set()  # wake wait_ready; it reports the error

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Stop the child (its in-flight episodes end first, as the thread's do) and wait for it;
        a child still alive after ``timeout`` is terminated."""
        self._stopping = True
        self._forward("stop", None, None)
        if self._sender is not None:
            self._sender.join(timeout)
        if self._proc is None:
            return
        self._proc.join(timeout)
        if self._proc.is_alive():
            log.warning("rollout process did not stop within %ss; terminating it", timeout)
            self._proc.terminate()
            self._proc.join(5)
        self._exited.wait(5)
        self._conn.close()
