"""The embedded loop's rollout thread: scheduled batches on an asyncio loop, within the lag bound.

It runs beside the learner (``trainer.backend=local``), or as the main loop of the rollout process
(``process``, :mod:`trainer.rollout_process`), fed by that process's own weight board.

Batch ``k`` starts once version ``schedule.sampling_version(k)`` is on the :class:`WeightBoard`
(the admission rule); its episodes run and are recorded by the batch loop every backend shares
(:class:`~trainer.rollout_batch.BatchLoop`), so a batch is whole in the ledger before
``on_batch_done(k)`` tells the learner thread so (``-1``: the thread failed, see ``error``).

The learner's end of the rollout: which batches are whole, and waiting for the next one.

Every backend that runs beside the learner (the rollout thread, the rollout process) reports batch
``k`` whole through :meth:`ReadyBatches.done` (``-1``: it failed, its ``error`` says why); the
learner waits in :meth:`ReadyBatches.wait`, which also watches the time budget and the rollout's
health, so a learner never waits for a rollout that has died.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.rollout_batch import BatchLoop
from trainer.weights import TrainingStopped, WeightBoard

if TYPE_CHECKING:
    from trainer.episodes import EpisodeOutcome
    from trainer.parts import RolloutSide
import time
from typing import Protocol

log = logging.getLogger(__name__)


class RolloutThread(threading.Thread):
    """Runs batches ``first_batch .. last_batch - 1`` with ``batches``, never ahead of the lag bound."""

    def __init__(
        self,
        *,
        batches: BatchLoop,
        first_batch: int,
        last_batch: int,
        board: WeightBoard,
        on_batch_done: Callable[[int], None],
    ) -> None:
        super().__init__(name="rollout", daemon=True)
        self.batches = batches
        self.next_batch = first_batch
        self.last_batch = last_batch
        self.board = board
        self.on_batch_done = on_batch_done
        self.error: BaseException | None = None

    @classmethod
    def beside(
        cls,
        side: RolloutSide,
        *,
        first_batch: int,
        last_batch: int,
        board: WeightBoard,
        concurrency: int,
        on_batch_done: Callable[[int], None],
        on_episode_done: Callable[[EpisodeOutcome], None] | None = None,
    ) -> RolloutThread:
        """Start a thread that rolls out ``side``'s batches beside the learner (``trainer.backend=local``),
        at most ``concurrency`` episodes at once, until ``board`` stops."""
        batches = BatchLoop.of_side(
            side,
            concurrency=max(1, concurrency),
            on_episode_done=on_episode_done,
            stopped=lambda: board.stopped,
        )
        thread = cls(
            batches=batches,
            first_batch=first_batch,
            last_batch=last_batch,
            board=board,
            on_batch_done=on_batch_done,
        )
        thread.start()
        return thread

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
        while self.next_batch < self.last_batch and not self.board.stopped:
            k = self.next_batch
            version = self.batches.schedule.sampling_version(k)
            weights = await asyncio.to_thread(self.board.wait_for, version)
            await self.batches.run(k, weights, version)
            self.next_batch = k + 1
            self.on_batch_done(k)


# =========================================================================== ready batches


class Rollout(Protocol):
    """What the learner sees of a running rollout (:class:`~trainer.rollout_thread.RolloutThread`,
    :class:`~trainer.rollout_process.RolloutProcess`)."""

    next_batch: int
    error: BaseException | None

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class ReadyBatches:
    """The highest batch reported whole, behind a condition the learner waits on."""

    def __init__(self, backend: str) -> None:
        self.backend = backend  # trainer.backend, for the error message
        self._ready = threading.Condition()
        self.last_done = -1

    def done(self, k: int) -> None:
        """Batch ``k`` is whole (``-1``: the rollout failed; the waiter finds its error)."""
        with self._ready:
            self.last_done = max(self.last_done, k) if k >= 0 else self.last_done
            self._ready.notify_all()

    def wait(self, k: int, rollout: Rollout, deadline: float, *, waiting: Callable[[bool], None]) -> bool:
        """Wait until batch ``k`` is whole; False when ``time.monotonic()`` passed ``deadline``
        (checked first: a learner that always finds its batch ready must stop on time too).
        Raises RuntimeError when the rollout failed or ended before producing the batch.
        ``waiting(True)`` and ``waiting(False)`` bracket the wait (the hook of that name)."""
        if time.monotonic() > deadline:
            return False
        waiting(True)
        try:
            return self._wait(k, rollout, deadline)
        finally:
            waiting(False)

    def _wait(self, k: int, rollout: Rollout, deadline: float) -> bool:
        with self._ready:
            while self.last_done < k:
                if rollout.error is not None:
                    raise RuntimeError(f"rollout failed: {rollout.error!r}") from rollout.error
                if not rollout.is_alive() and self.last_done < k:
                    raise RuntimeError(f"rollout ({self.backend}) ended before producing the batch")
                if time.monotonic() > deadline:
                    return False
                self._ready.wait(timeout=0.5)
        return True
