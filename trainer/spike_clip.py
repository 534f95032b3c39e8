"""Spike clipping: bound a step's gradient norm by a multiple of the recent median.

Why. Adam's second moment (``beta2 = 0.999``) remembers ~1,000 steps of gradient scale, so a
batch whose gradient is far larger than the recent ones is not normalised away: the update grows
with it, and the first moment (``beta1 = 0.9``) keeps pushing the same way for ~10 more steps.
The fixed clip (``optim.grad_clip``, 1.0) is set for the start of training and is far above the
norms a converging RL run produces, so it does not see such a step.

Measured on python-tool-tiny (``configs/python-tool-tiny.yaml``), from checkpoints of two
runs that collapsed, recomputing the stored batch of the collapsing step with the real AdamW state
and measuring the tempered KL(old || new) on the sampled tokens of that batch and the next:

* a step with gradient norm 1.82 against a median of ~0.1 over the 50 before it (one failed row,
  one digit sampled at p ~0.003): KL 0.014 after the step and 0.185 after five more steps on the
  same momentum, against 0.00006 and 0.0012 for an ordinary step of the same run. Clipped to 2x
  the median: 0.00024 and 0.016; to 1x: 0.00004 and 0.002;
* a run converged to batch reward ~0.95, where most batches are all-correct (gradient 0) and the
  others ~0.002: a step of 0.16 moved every parameter by about ``lr`` (0.0033 after five more
  steps); clipped to 10x the median of the non-zero norms: 0.00007.

Per-coordinate clipping against Adam's own second moment (3 or 10 sigma) did not help the first
case (0.114 and 0.184): the spike is a coherent direction, not a few outlying coordinates, so the
bound is on the global norm.

How tight. Spikes also grow Adam's second moment, which shrinks the steps after them; a bound near
the median removes that, so the steps stay large. On python-tool-tiny a bound of 1.5x the median
clipped 112 of 478 steps and the run went through a rough stretch (batch reward 0.41 over 20
steps, acceptance ~0.65) before it ended at 100% held out; 10x cut 11-32 steps of 442-514 (with
``objective.negative_min_prob`` 0.01 for the single-token spikes) and ran smoothly. The preset uses 10.
It does not stop a drift made of several moderate steps while the policy still learns (gradient norms
2-5x the median, where 10x the median is no tighter than ``optim.grad_clip``): one of three seeds of
``benchmarks/learning.py`` on python-tool-tiny (collapse guard off) went that way (docs/DESIGN.md).

How. The bound is ``k x median`` of the last ``window`` pre-clip gradient norms that were not 0
(a batch whose advantages are all 0 carries no scale). Until ``MIN_HISTORY`` norms are known it
does not bound anything. A clipped step records its pre-clip norm too: the median, unlike a mean,
is not pulled up by the spikes it clips, and a lasting rise in scale (more than half the window)
moves it. The history is part of the learner's state, saved in checkpoints, so that a resumed run
clips exactly as an uninterrupted one. A step's ``spike_clipped`` metric (metrics.jsonl) is 1 when this
bound, below ``optim.grad_clip``, cut it.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Any

MIN_HISTORY = 10


class SpikeClip:
    """The running bound ``k x median(recent non-zero gradient norms)``.

    Args:
        k: the multiple of the median (> 0).
        window: how many recent non-zero norms the median is taken over (>= 1).
    """

    def __init__(self, k: float, window: int = 50) -> None:
        if not (k > 0 and math.isfinite(k)):
            raise ValueError(f"optim.spike_clip: must be a finite number > 0, got {k!r}")
        if window < 1:
            raise ValueError(f"optim.spike_window: must be >= 1, got {window!r}")
        self.k = float(k)
        self.window = int(window)
        self.norms: collections.deque[float] = collections.deque(maxlen=self.window)

    def bound(self) -> float:
        """The largest gradient norm the next step may take (inf until ``MIN_HISTORY`` norms are known)."""
        if len(self.norms) < min(MIN_HISTORY, self.window):
            return math.inf
        return self.k * statistics.median(self.norms)

    def record(self, norm: float) -> None:
        """Remember a step's gradient norm before clipping (0 and non-finite norms are skipped)."""
        if norm > 0 and math.isfinite(norm):
            self.norms.append(float(norm))

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self.norms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = collections.deque((float(x) for x in state.get("norms", [])), maxlen=self.window)
