"""The collapse guard: the first five batches set the baseline; the mean of the last ten below half of it stops."""

from __future__ import annotations

from types import SimpleNamespace

from trainer.guards import Guards


def _feed(guards: Guards, rewards: list[float]) -> list[bool]:
    state = SimpleNamespace(baseline_reward=None)
    return [guards.collapsed(r, state) for r in rewards]


def test_collapse_fires_when_the_last_ten_batches_fall_below_half_the_first_five() -> None:
    # baseline 0.8, so the bound is 0.4; ten batches at 0.5 stay above it, then each 0.0 lowers the
    # window's mean by 0.05: 0.45, 0.40 (not below), 0.35 (below)
    flags = _feed(Guards(1, True), [0.8] * 5 + [0.5] * 10 + [0.0] * 3)
    assert flags == [False] * 17 + [True]


def test_collapse_never_fires_when_off_or_when_the_baseline_is_tiny() -> None:
    assert not any(_feed(Guards(1, False), [0.6] * 5 + [0.0] * 20))
    assert not any(_feed(Guards(1, True), [0.04] * 5 + [0.0] * 20))
