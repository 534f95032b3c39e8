"""The learner's end of the rollout: which batches are whole, and waiting for the next one.

Every backend that runs beside the learner (the rollout thread, the rollout process) reports batch
``k`` whole through :meth:`ReadyBatches.done` (``-1``: it failed, its ``error`` says why); the
learner waits in :meth:`ReadyBatches.wait`, which also watches the time budget and the rollout's
health, so a learner never waits for a rollout that has died.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


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
