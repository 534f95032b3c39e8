"""One batch of scheduled episodes: the loop every rollout backend runs.

The rollout thread (``trainer.backend=local``), the rollout process (``process``, which runs that
thread in a child) and each Ray rollout worker (``ray``) all call :meth:`BatchLoop.run` for the
episodes of batch ``k``::

    set the sampling weights (only when the version changed)
    drop the episodes the ledger already holds (a resumed run does not run them again)
    run the rest concurrently (at most ``concurrency`` at once)
    record each finished episode in the ledger, then tell ``on_episode_done``

The episodes that finish in the same turn of the event loop (a burst of tree commits resolves many
at once) share one ledger transaction, written before the loop turns again, so an acknowledgement
waits no longer than one loop turn. When an episode fails, the others are cancelled, the ones that
did finish are recorded (a resume reruns only the rest) and the failure is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainer.weights import TrainingStopped

if TYPE_CHECKING:
    import torch

    from fr_agents.ledger import EpisodeLedger
    from trainer.batches import EpisodeSchedule, EpisodeSpec
    from trainer.episodes import EpisodeOutcome
    from trainer.parts import RolloutSide


@dataclass
class BatchLoop:
    """Runs the episodes of one scheduled batch and records them (see the module docstring).

    ``run_episode``: the episode runner's ``run`` (a coroutine per :class:`EpisodeSpec`).
    ``concurrency``: episodes at most at once (``None``: all of the batch at once).
    ``on_episode_done``: a hook, told of each finished episode once the ledger holds it.
    ``stopped``: asked before each episode starts; once true the batch ends with
    :class:`~trainer.weights.TrainingStopped`.
    """

    schedule: EpisodeSchedule
    ledger: EpisodeLedger
    set_weights: Callable[[dict[str, torch.Tensor], int], None]
    run_episode: Callable[[EpisodeSpec], Awaitable[EpisodeOutcome]]
    concurrency: int | None = None
    on_episode_done: Callable[[EpisodeOutcome], None] | None = None
    stopped: Callable[[], bool] = lambda: False
    version: int | None = field(default=None, init=False)  # the version the engine holds
    _unrecorded: list[tuple[EpisodeSpec, EpisodeOutcome]] = field(
        default_factory=list, init=False
    )  # this loop turn's
    _record_error: BaseException | None = field(default=None, init=False)

    @classmethod
    def of_side(
        cls,
        side: RolloutSide,
        *,
        concurrency: int | None = None,
        on_episode_done: Callable[[EpisodeOutcome], None] | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> BatchLoop:
        """The batch loop of a rollout side (:func:`trainer.parts.build_rollout_side`): its
        schedule, its ledger and its episode runner."""
        return cls(
            schedule=side.schedule,
            ledger=side.ledger,
            set_weights=side.runner.set_weights,
            run_episode=side.runner.run,
            concurrency=concurrency,
            on_episode_done=on_episode_done,
            stopped=stopped,
        )

    async def run(
        self,
        k: int,
        weights: dict[str, torch.Tensor],
        version: int,
        *,
        episodes: Collection[int] | None = None,
    ) -> list[tuple[EpisodeSpec, EpisodeOutcome]]:
        """Run batch ``k`` (only ``episodes`` of it, when given: a Ray worker's share) with
        ``weights`` of ``version``; returns the episodes it ran, in the schedule's order."""
        if self.version != version:
            self.set_weights(weights, version)
            self.version = version
        specs = [s for s in self.schedule.episodes(k) if episodes is None or s.episode in episodes]
        done = self.ledger.done(s.episode for s in specs)
        todo = [s for s in specs if s.episode not in done]
        sem = asyncio.Semaphore(self.concurrency or max(1, len(todo)))
        ran: dict[int, EpisodeOutcome] = {}

        async def one(spec: EpisodeSpec) -> None:
            async with sem:
                if self.stopped():
                    raise TrainingStopped()
                out = await self.run_episode(spec)
                if not self._unrecorded:  # the first of this loop turn: record them all at its end
                    asyncio.get_running_loop().call_soon(self._record_soon)
                self._unrecorded.append((spec, out))
                ran[spec.episode] = out

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
        return [(s, ran[s.episode]) for s in todo]

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
