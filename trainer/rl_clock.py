"""The RL clock: the seconds a run spends learning, across resumes, and its time budget.

Set-up (building the parts, the pre-RL evaluations, the warm start) is not RL time. The clock
starts once the run is open; a checkpoint and the run's end add the seconds since the last of
them to ``TrainerState.rl_elapsed_s``, which a checkpoint keeps, so ``trainer.max_minutes`` counts
the RL time of a resumed run's earlier lives too.
"""

from __future__ import annotations

import math
import time

from trainer.checkpoint import TrainerState


class RLClock:
    """Starts when RL starts; see the module docstring."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last_step_end = time.perf_counter()

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

    def lap(self) -> float:
        """Seconds since the previous step ended (or the start): this step's share of the wall."""
        now = time.perf_counter()
        seconds, self.last_step_end = now - self.last_step_end, now
        return seconds
