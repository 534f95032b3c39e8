"""The collapse guard (the first five batches set the baseline; the mean of the last ten below half of it
stops) and the plateau stop (the moving mean batch reward stopped gaining for `patience` steps)."""

from __future__ import annotations

from types import SimpleNamespace

from trainer.guards import Guards, Plateau


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


def _plateau_flags(
    plateau: Plateau, rewards: list[float], state: SimpleNamespace | None = None
) -> list[bool]:
    state = state or SimpleNamespace(step=0, extra={})
    flags = []
    for r in rewards:
        state.step += 1
        flags.append(plateau.reached(r, state))
    return flags


def test_plateau_stops_a_run_whose_moving_mean_stopped_gaining_and_not_one_that_climbs() -> None:
    climbing = [i / 1000 for i in range(300)]  # the 10-step mean gains 0.01 every 10 steps
    assert not any(_plateau_flags(Plateau(patience=20, window=10, min_delta=0.01), climbing))
    # 0.0 for 30 steps, then 0.5: the 10-step mean rises 0.05 a step over steps 31-40 (the last gain
    # at step 40), then stays: the stop comes 25 steps later, at step 65
    step_up = [0.0] * 30 + [0.5] * 70
    flags = _plateau_flags(Plateau(patience=25, window=10, min_delta=0.01), step_up)
    assert flags.index(True) == 64


def test_plateau_is_off_at_patience_zero() -> None:
    assert not any(_plateau_flags(Plateau(patience=0, window=10, min_delta=0.01), [0.5] * 200))


def test_plateau_resumed_from_its_saved_state_stops_at_the_same_step() -> None:
    rewards = [min(i, 40) / 100 for i in range(1, 121)]
    whole = _plateau_flags(Plateau(30, 10, 0.01), rewards)
    first = Plateau(30, 10, 0.01)
    state = SimpleNamespace(step=0, extra={})
    head = _plateau_flags(first, rewards[:55], state)
    again = Plateau(30, 10, 0.01)
    again.restore(state.extra["plateau"])
    tail = _plateau_flags(again, rewards[55:], SimpleNamespace(step=55, extra={}))
    assert head + tail == whole and True in whole
