"""The run's guards: the staleness bound checked on every batch, the collapse guard, and the
plateau stop.

* **Lag.** Every trajectory's lag (the learner's version at the step minus the oldest policy
  version on its path) must stay within ``rollout.max_policy_lag``; a larger one is a bug in the
  admission rule, so it raises. The lags go into a histogram (metrics, checkpoints).
* **Collapse.** The mean reward of the first five batches is the baseline; when the mean of the
  last ten falls below half of it (and the baseline is at least 0.05), the run stops; its result
  is the last good checkpoint, which the loop evaluates held out (``trainer.collapse_guard``).
* **Plateau.** A run that still learns should go on; one that stopped learning should not spend
  its time budget. :class:`Plateau` ends RL (normally: the final evaluation and checkpoint follow)
  once the batch reward's moving mean has not improved for ``trainer.plateau_patience`` steps.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fr_agents.tree.batch import FlatBatch
    from trainer.checkpoint import TrainerState

COLLAPSE_BASELINE_BATCHES = 5
COLLAPSE_WINDOW = 10


class Guards:
    """Lag bookkeeping and the collapse guard of one run (see the module docstring)."""

    def __init__(self, max_policy_lag: int, collapse_guard: bool) -> None:
        self.lag = max_policy_lag
        self.collapse_guard = collapse_guard
        self.lag_histogram: collections.Counter[int] = collections.Counter()
        self.recent: collections.deque[float] = collections.deque(maxlen=COLLAPSE_WINDOW)
        self.first_rewards: list[float] = []

    def lags(self, flat: FlatBatch, k: int) -> list[int]:
        """Per-trajectory lag at step ``k``; raises RuntimeError past ``max_policy_lag``."""
        v = flat.versions.masked_fill(~flat.action_mask, 1 << 40)
        oldest = v.min(dim=1).values.tolist()
        lags = [int(k - o) for o in oldest]
        self.lag_histogram.update(lags)
        if max(lags, default=0) > self.lag:
            raise RuntimeError(
                f"step {k}: a trajectory lags {max(lags)} versions > max_policy_lag={self.lag}"
            )
        return lags

    def collapsed(self, reward: float, state: TrainerState) -> bool:
        """Record batch ``reward`` (setting ``state.baseline_reward`` after the first batches);
        True when the recent rewards fell below half the baseline."""
        self.recent.append(reward)
        if len(self.first_rewards) < COLLAPSE_BASELINE_BATCHES and state.baseline_reward is None:
            self.first_rewards.append(reward)
            if len(self.first_rewards) == COLLAPSE_BASELINE_BATCHES:
                state.baseline_reward = sum(self.first_rewards) / COLLAPSE_BASELINE_BATCHES
        base = state.baseline_reward
        if not self.collapse_guard or base is None or base < 0.05 or len(self.recent) < COLLAPSE_WINDOW:
            return False
        return sum(self.recent) / len(self.recent) < 0.5 * base

    def histogram(self) -> dict[str, int]:
        """The lag histogram with string keys (JSON, checkpoints)."""
        return {str(k): v for k, v in self.lag_histogram.items()}

    def restore(self, histogram: dict[str, int]) -> None:
        self.lag_histogram.update({int(k): v for k, v in histogram.items()})


class Plateau:
    """The plateau stop (``trainer.plateau_patience``, ``plateau_window``, ``plateau_min_delta``).

    The signal is the mean batch reward over the last ``window`` steps (the policy's own samples,
    so no extra evaluation is paid for). Each time that mean beats the best so far by at least
    ``min_delta``, the best moves up; when ``patience`` steps pass without such a gain, the run has
    reached its plateau. The state lives in ``state.extra["plateau"]`` so a resumed run stops
    where the uninterrupted one would.
    """

    def __init__(self, patience: int, window: int, min_delta: float) -> None:
        self.patience, self.window, self.min_delta = patience, window, min_delta
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.best = -float("inf")
        self.best_step = 0

    def reached(self, reward: float, state: TrainerState) -> bool:
        """Record the batch ``reward`` of step ``state.step``; True when the plateau is reached
        (never when ``patience`` is 0)."""
        if self.patience <= 0:
            return False
        self.recent.append(reward)
        if len(self.recent) == self.window:
            mean = sum(self.recent) / self.window
            if mean >= self.best + self.min_delta:
                self.best, self.best_step = mean, state.step
        state.extra["plateau"] = {"recent": list(self.recent), "best": self.best, "best_step": self.best_step}
        return len(self.recent) == self.window and state.step - self.best_step >= self.patience

    def restore(self, saved: dict[str, Any] | None) -> None:
        """Continue from ``state.extra["plateau"]`` of a checkpoint (None: from scratch)."""
        if saved:
            self.recent.extend(saved["recent"])
            self.best, self.best_step = float(saved["best"]), int(saved["best_step"])
