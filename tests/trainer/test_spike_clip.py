"""The spike clip's running bound (trainer/learner.py) and what the learner does with it."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from fr_agents.tree.batch import build_flat
from tests.trainer.learners import make_learner
from tests.trainer.test_learner import make_trajectories, tiny_model
from trainer.learner import MIN_HISTORY, Learner, SpikeClip


def test_no_bound_until_enough_non_zero_norms_are_known() -> None:
    clip = SpikeClip(2.0, window=50)
    for _ in range(MIN_HISTORY - 1):
        clip.record(0.1)
        clip.record(0.0)  # a batch without signal carries no scale
    assert clip.bound() == math.inf
    clip.record(0.1)
    assert clip.bound() == pytest.approx(0.2)


def test_the_bound_is_k_times_the_median_of_the_last_window_norms() -> None:
    clip = SpikeClip(1.5, window=5)  # a window below MIN_HISTORY bounds once it is full
    for x in (9.0, 1.0, 2.0, 3.0, 100.0):
        clip.record(x)
    assert clip.bound() == pytest.approx(1.5 * 3.0)
    clip.record(4.0)  # 9.0 leaves the window
    assert list(clip.norms) == [1.0, 2.0, 3.0, 100.0, 4.0]
    assert clip.bound() == pytest.approx(1.5 * 3.0)
    clip.record(math.nan)
    clip.record(math.inf)
    assert list(clip.norms) == [1.0, 2.0, 3.0, 100.0, 4.0]


def test_state_round_trips() -> None:
    a = SpikeClip(2.0, window=4)
    for x in (1.0, 2.0, 3.0, 4.0, 5.0):
        a.record(x)
    b = SpikeClip(2.0, window=4)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert list(b.norms) == [2.0, 3.0, 4.0, 5.0] and b.bound() == a.bound()


@pytest.mark.parametrize(
    "k,window,field",
    [(0.0, 5, "optim.spike_clip"), (math.inf, 5, "optim.spike_clip"), (1.0, 0, "optim.spike_window")],
)
def test_bad_settings_name_the_field(k: float, window: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SpikeClip(k, window)


def _sgd_learner(model: torch.nn.Module, **kw) -> Learner:
    return make_learner(model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), **kw)


@torch.no_grad()
def _update_norm(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return math.sqrt(
        sum(float(((pa - pb) ** 2).sum()) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    )


def test_grad_clip_bounds_the_applied_gradient() -> None:
    torch.set_num_threads(1)
    model = tiny_model()
    trajs = make_trajectories(model)
    free = _sgd_learner(copy.deepcopy(model), grad_clip=0.0)
    start = copy.deepcopy(model)
    norm = free.step(build_flat(trajs))["grad_norm"]
    assert _update_norm(free.model, start) == pytest.approx(
        norm, rel=1e-5
    )  # SGD at lr 1: the update is the gradient
    clipped = _sgd_learner(model, grad_clip=norm / 4)
    stats = clipped.step(build_flat(trajs))
    assert stats["grad_norm"] == pytest.approx(norm, rel=1e-6)  # reported before clipping
    assert _update_norm(model, start) == pytest.approx(norm / 4, rel=1e-4)


def test_spike_clip_bounds_a_step_to_k_times_the_recent_median_and_records_its_norm() -> None:
    torch.set_num_threads(1)
    model = tiny_model()
    trajs = make_trajectories(model)
    start = copy.deepcopy(model)
    learner = _sgd_learner(model, grad_clip=0.0, spike_clip=2.0, spike_window=50)
    norm = _sgd_learner(copy.deepcopy(model), grad_clip=0.0).step(build_flat(trajs))["grad_norm"]
    for _ in range(MIN_HISTORY):
        learner.spike.record(norm / 10)  # a history far below this batch's scale
    stats = learner.step(build_flat(trajs))
    assert stats["spike_clipped"] == 1.0 and stats["grad_norm"] == pytest.approx(norm, rel=1e-6)
    assert _update_norm(model, start) == pytest.approx(2.0 * norm / 10, rel=1e-4)
    assert learner.spike.norms[-1] == pytest.approx(norm, rel=1e-6)
    # a step within the bound is left as it is
    calm = _sgd_learner(copy.deepcopy(start), grad_clip=0.0, spike_clip=2.0)
    for _ in range(MIN_HISTORY):
        calm.spike.record(norm)
    assert calm.step(build_flat(trajs))["spike_clipped"] == 0.0
    assert _update_norm(calm.model, start) == pytest.approx(norm, rel=1e-5)
    # where the fixed clip is the tighter bound, it does the cutting and the step is not counted as
    # spike-clipped
    fixed = _sgd_learner(copy.deepcopy(start), grad_clip=norm / 20, spike_clip=2.0)
    for _ in range(MIN_HISTORY):
        fixed.spike.record(norm / 10)
    assert fixed.step(build_flat(trajs))["spike_clipped"] == 0.0
    assert _update_norm(fixed.model, start) == pytest.approx(norm / 20, rel=1e-4)


def test_the_learner_state_carries_the_spike_history() -> None:
    model = tiny_model()
    a = make_learner(model, spike_clip=2.0)
    for x in range(1, 12):
        a.spike.record(float(x))
    b = make_learner(copy.deepcopy(model), spike_clip=2.0)
    b.load_state_dict(a.state_dict())
    assert list(b.spike.norms) == list(a.spike.norms)
    assert Learner(model).state_dict()["spike_clip"] is None


def test_a_checkpoint_carries_the_spike_history_to_the_resumed_learner(tmp_path) -> None:
    """checkpoint_run saves the history with the run's checkpoint; resume_run gives it back, so a
    resumed run bounds its next step as the uninterrupted one would."""
    from fr_agents.config import config_from_dict
    from fr_agents.tree import TrajectoryTree
    from trainer.checkpoint import TrainerState, checkpoint_run, resume_run
    from trainer.parts import build_learner_side

    cfg = config_from_dict(
        {
            "model": {"tiny_size": "nano"},
            "optim": {"spike_clip": 2.0, "spike_window": 20},
            "trainer": {"eval_episodes": 0},
        }
    )
    side = build_learner_side(cfg, tmp_path, console=False)
    norms = [0.1 * (i + 1) for i in range(12)]
    for x in norms:
        side.learner.spike.record(x)
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    checkpoint_run(tmp_path, side, TrainerState(step=3), tree=tree, lag=0, lag_histogram={}, keep=2)
    fresh = build_learner_side(cfg, tmp_path, console=False)
    assert fresh.learner.spike.bound() == math.inf
    resume_run(tmp_path, fresh, tree=tree)
    assert list(fresh.learner.spike.norms) == pytest.approx(norms)
    assert fresh.learner.spike.bound() == pytest.approx(side.learner.spike.bound())
    tree.close()
