"""The embedded loop's rollout thread: scheduled batches on an asyncio loop, within the lag bound.

It runs beside the learner (``trainer.backend=local``), or as the main loop of the rollout process
(``process``, :mod:`trainer.rollout_process`), fed by that process's own weight board.

Batch ``k`` starts once version ``schedule.sampling_version(k)`` is on the :class:`WeightBoard`
(the admission rule); its episodes run concurrently (at most ``concurrency`` at once) and each
finished one is recorded in the ledger: the episodes that finish in the same turn of the event
loop (a burst of tree commits resolves many at once) share one ledger transaction, written before
the loop turns again, so an acknowledgement waits no longer than one loop turn and a batch is
whole in the ledger before ``on_batch_done``. Episodes the ledger already holds (a resumed run) are not
run again. ``on_batch_done(k)`` tells the learner thread that batch ``k`` is whole
(``-1``: the thread failed, see ``error``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from trainer.ledger import EpisodeLedger
from trainer.schedule import EpisodeSchedule, EpisodeSpec
from trainer.weights import TrainingStopped, WeightBoard

log = logging.getLogger(__name__)


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
        on_episode_done: Callable[[Any], None] | None = None,
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
        self.on_episode_done = on_episode_done  # a hook: each finished episode's outcome
        self.error: BaseException | None = None
        self._loop_version: int | None = None
        self._unrecorded: list[tuple[EpisodeSpec, Any]] = []  # finished this loop turn, for the ledger
        self._record_error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except TrainingStopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the learner thread
            self.error = e
            log.exception("rollout thread failed")
            self.on_batch_done(-1)

    def _record(self) -> None:
        """Write the finished episodes not yet in the ledger, in one transaction, then tell the
        ``on_episode_done`` hook of each. Raises a failure of an earlier :meth:`_record_soon`."""
        if self._record_error is not None:
            raise self._record_error
        finished, self._unrecorded = self._unrecorded, []
        self.ledger.record_outcomes(finished)
        if self.on_episode_done is not None:
            for _, out in finished:
                self.on_episode_done(out)

    def _record_soon(self) -> None:
        """:meth:`_record` as a loop callback: a failure is kept for the batch to raise (a callback's
        exception would only be logged by the loop)."""
        try:
            self._record()
        except BaseException as e:  # noqa: BLE001 - raised by the batch, see _record
            self._record_error = e

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
            done = self.ledger.done(s.episode for s in specs)
            todo = [s for s in specs if s.episode not in done]

            async def one(spec: EpisodeSpec) -> None:
                async with sem:
                    if self.board.stopped:
                        raise TrainingStopped()
                    out = await self.run_episode(spec)
                    if not self._unrecorded:  # the first of this loop turn: record them all at its end
                        asyncio.get_running_loop().call_soon(self._record_soon)
                    self._unrecorded.append((spec, out))

            tasks = [asyncio.create_task(one(s)) for s in todo]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._record()  # the episodes that did finish are kept
                raise
            self._record()
            self.next_batch = k + 1
            self.on_batch_done(k)
