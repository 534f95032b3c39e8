"""The async loop: the policy lag stays within max_policy_lag; NaN losses stop the run cleanly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from fr_agents.config import ConfigError, load_config
from fr_agents.ledger import EpisodeLedger
from fr_agents.tree import TrajectoryTree
from trainer.checkpoint import latest_checkpoint
from trainer.loop import TrainerHooks, run_training

BASE = [
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "env.kwargs={answer_format: plain, format_reward: 0.1}",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "trainer.checkpoint_every=0",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "trainer.plot_every=2",
    "trainer.collapse_guard=false",
    "warm_start.examples=0",
    "trainer.threads=1",
]


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lag", [0, 2])
def test_policy_lag_never_exceeds_max_policy_lag(tmp_path: Path, lag: int) -> None:
    torch.set_num_threads(1)
    steps = 5
    cfg = load_config("math-tiny", [*BASE, f"rollout.max_policy_lag={lag}", f"trainer.steps={steps}"])
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok and res.steps == steps
    rows = [r for r in _rows(tmp_path) if r["kind"] == "step"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["lag_max"] <= lag for r in rows)
    # Rollout really runs ahead: once the pipeline is full, trajectories are exactly `lag` old.
    assert [r["lag_max"] for r in rows] == [min(k, lag) for k in range(steps)]
    # The store agrees: every policy token of batch k was sampled by version k - lag (or 0).
    ledger, tree = EpisodeLedger(tmp_path / "episodes.sqlite"), TrajectoryTree.open(tmp_path / "store.sqlite")
    for k in range(steps):
        batch = ledger.batch_rows(k)
        assert len(batch) == cfg.trainer.batch_size
        for traj in tree.trajectories([r[1] for r in batch]):
            versions = {v for v, m in zip(traj.versions, traj.policy_mask, strict=True) if m}
            assert versions == {max(0, k - lag)}
    assert tree.stats()["available"] == 0, "every finished trajectory is consumed, none discarded"
    ledger.close()
    tree.close()
    assert (tmp_path / "curves.png").exists() and any((tmp_path / "tb").iterdir())
    end = [r for r in _rows(tmp_path) if r["kind"] == "end"][0]
    assert sum(end["lag_histogram"].values()) == steps * cfg.trainer.batch_size


def test_nan_loss_stops_keeps_checkpoint_and_saves_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    from trainer.learner import Learner, NonFiniteLossError

    real_step = Learner.step

    def poisoned(self: Learner, batch):  # the third step produces a NaN loss
        if self.version == 2:
            raise NonFiniteLossError("non-finite loss nan", batch, {"loss": float("nan")})
        return real_step(self, batch)

    monkeypatch.setattr(Learner, "step", poisoned)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=6", "trainer.checkpoint_every=1"])
    res = run_training(cfg, tmp_path, console=False)
    assert not res.ok and res.stop_reason == "non-finite loss" and res.steps == 2
    assert latest_checkpoint(tmp_path).name == "step_000002"
    saved = torch.load(tmp_path / "nan_batch_step2.pt", weights_only=False)
    assert saved["token_ids"].shape[0] == cfg.trainer.batch_size and len(saved["leaf_ids"]) == 8
    stop = [r for r in _rows(tmp_path) if r["kind"] == "stop"][0]
    assert stop["reason"] == "non-finite loss"


def test_a_stopped_run_evaluates_the_last_good_checkpoint_it_hands_back(tmp_path: Path) -> None:
    """A run stopped by a guard keeps its last good checkpoint; its ``after_rl`` held-out figure is
    of that checkpoint (its step, its weights), not of the weights the run stopped with."""
    from safetensors.torch import load_file

    from trainer.learner import NonFiniteLossError
    from trainer.loop import Trainer, TrainerHooks

    class NonFiniteAtThirdStep(TrainerHooks):
        """A fake fault (a real non-finite loss needs a broken model): the third step runs, so the
        weights move past the step-2 checkpoint, and is then reported non-finite."""

        def run_started(self, trainer):
            self.trainer = trainer

        def around_step(self, step):
            stats = step()
            if self.trainer.learner.version == 3:
                raise NonFiniteLossError("non-finite loss nan (fake)", None, stats)
            return stats

    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny", [*BASE, "trainer.steps=6", "trainer.checkpoint_every=2", "trainer.eval_episodes=8"]
    )
    trainer = Trainer(cfg, tmp_path, console=False, hooks=NonFiniteAtThirdStep())
    res = trainer.run()
    assert not res.ok and res.stop_reason == "non-finite loss" and res.steps == 2
    kept = tmp_path / "checkpoints" / "step_000002"
    assert res.last_checkpoint == kept and latest_checkpoint(tmp_path) == kept
    # the model the run hands back holds the checkpoint's weights (the third step's update is gone)
    saved = load_file(kept / "model.safetensors")
    live = trainer.model.state_dict()
    assert all(torch.equal(live[k], v) for k, v in saved.items())
    evals = {r["name"]: r for r in _rows(tmp_path) if r["kind"] == "eval"}
    assert evals["after_rl"]["step"] == 2 and evals["after_rl"]["checkpoint_step"] == 2
    assert res.evals["after_rl"]["checkpoint_step"] == 2 and res.evals["after_rl"]["episodes"] == 8
    assert "the last good checkpoint (step 2)" in res.summary()


class _SlowSteps(TrainerHooks):
    """Learner steps ``sleeps[i]`` seconds longer (a real sleep) at step ``i``, the last value for every
    later step, so the rollout, two batches ahead, is always done first."""

    def __init__(self, *sleeps: float) -> None:
        self.sleeps = sleeps
        self.calls = 0

    def around_step(self, step):
        time.sleep(self.sleeps[min(self.calls, len(self.sleeps) - 1)])
        self.calls += 1
        return step()


def _budget_run(tmp_path: Path, hooks, *overrides: str):
    """math-tiny, 40 steps at lag 2 under a 6-s RL budget (``trainer.max_minutes=0.1``), with ``hooks``."""
    from trainer.loop import Trainer

    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny",
        [*BASE, "rollout.max_policy_lag=2", "trainer.steps=40", "trainer.max_minutes=0.1", *overrides],
    )
    return Trainer(cfg, tmp_path, console=False, hooks=hooks).run()


def test_time_budget_stops_a_learner_that_never_waits(tmp_path: Path) -> None:
    """``trainer.max_minutes`` ends the run even when every batch is ready before the learner asks
    (a learner slower than its rollout never waits, and the budget must still be checked)."""
    res = _budget_run(tmp_path, _SlowSteps(3.0))
    assert res.ok and res.stop_reason == "time budget"
    assert res.steps <= 3  # 6 s of budget, 3 s and more per step (without the check: all 40)


def test_a_step_expected_to_end_past_the_time_budget_is_not_started(tmp_path: Path) -> None:
    """A step is never cut once started, so ``trainer.max_minutes`` does not start one that would end
    past it by the last step's time: with 2.5-s steps and a 6-s budget, the third is not started
    (it would end at ~7.5 s) and every step that ran ended inside the budget."""
    res = _budget_run(tmp_path, _SlowSteps(2.5))
    assert res.ok and res.stop_reason == "time budget"
    ended = {r["step"]: r["elapsed_s"] for r in _rows(tmp_path) if r["kind"] == "step"}
    assert 1 <= len(ended) <= 2 and res.steps == len(ended)
    assert all(e < 6.0 for e in ended.values())  # without the check the last one ends past 6 s
    assert ended[max(ended)] + 2.5 > 6.0  # and the next would have ended past the budget


def test_the_dry_run_plan_states_the_time_budget_rule() -> None:
    """The plan says what the run does with ``trainer.max_minutes``: no step starts that would end past it."""
    from trainer.preflight import placement_plan

    def batches_line(minutes: str) -> str:
        plan = placement_plan(load_config("math-tiny", [f"trainer.max_minutes={minutes}"]))
        (line,) = [ln for ln in plan if ln.startswith("batches:")]
        return line

    assert "3.0 min of RL (no step starts that the last step's time would end past it)" in batches_line("3")
    assert "min" not in batches_line("0")


def test_a_step_that_ends_past_the_time_budget_runs_no_periodic_evaluation(tmp_path: Path) -> None:
    """``trainer.eval_every`` evaluations run only while ``trainer.max_minutes`` lasts: a step that
    ends past the budget (here it takes far longer than the step before, so it was started) leaves its
    evaluation to the held-out one after RL (which follows at once)."""
    res = _budget_run(
        tmp_path,
        _SlowSteps(0.5, 7.0),  # the first step 0.5 s longer, every later one 7 s
        "trainer.eval_every=1",
        "trainer.eval_episodes=2",
        "trainer.eval_during_episodes=2",
    )
    assert res.ok and res.stop_reason == "time budget"
    rows = _rows(tmp_path)
    ended = {r["step"]: r["elapsed_s"] for r in rows if r["kind"] == "step"}
    during = [r["step"] for r in rows if r["kind"] == "eval" and r.get("name") == "during"]
    assert ended[max(ended)] >= 6.0  # the last step ended past the 6-s budget ...
    assert max(ended) not in during  # ... and ran no evaluation
    assert all(ended[s] < 6.0 for s in during)


def test_the_warm_start_uses_the_cores_it_is_given_and_rl_uses_trainer_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm start runs on every core this process may use, each RL step on ``trainer.threads``,
    and the caller's thread count is what it was once the run is over."""
    import os

    from trainer.loop import Trainer, TrainerHooks

    seen: list[int] = []

    class Threads(TrainerHooks):
        def around_step(self, step):
            seen.append(torch.get_num_threads())
            return step()

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=2", "warm_start.examples=4", "warm_start.epochs=1"])
    res = Trainer(cfg, tmp_path, console=False, hooks=Threads()).run()
    assert res.ok and res.steps == 2
    (ws,) = [r for r in _rows(tmp_path) if r["kind"] == "warm_start"]
    assert ws["threads"] == len(os.sched_getaffinity(0))
    assert seen == [1, 1]
    assert torch.get_num_threads() == 1


def test_the_warm_start_takes_one_thread_when_given_one_core_or_told_by_omp_num_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pinned to one CPU (``taskset -c 0``), or with ``OMP_NUM_THREADS=1``, the warm start does
    not raise torch's threads to the machine's core count (threads spinning against each other on
    shared cores slowed it ~20x)."""
    import os

    from trainer.os_tuning import pinned, usable_cpus, warm_start_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pinned(usable_cpus()[:1]), warm_start_cores():
        assert torch.get_num_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with warm_start_cores():
        assert torch.get_num_threads() == 1
    if len(os.sched_getaffinity(0)) > 1:
        monkeypatch.delenv("OMP_NUM_THREADS")
        with warm_start_cores():
            assert torch.get_num_threads() == len(os.sched_getaffinity(0))


def test_a_run_that_reaches_its_plateau_stops_and_ends_normally(tmp_path: Path) -> None:
    """``trainer.plateau_patience``: a gain of 1.0 in a mean reward is impossible after the first
    full window (step 2), so the run stops 3 steps later, at step 5, of the 40 it may take, and
    ends as a normal run does (the final evaluation and checkpoint)."""
    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny",
        [
            *BASE,
            "trainer.steps=40",
            "trainer.plateau_patience=3",
            "trainer.plateau_window=2",
            "trainer.plateau_min_delta=1.0",
            "trainer.eval_episodes=4",
        ],
    )
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok and res.stop_reason == "plateau" and res.steps == 5
    assert "after_rl" in res.evals
    (end,) = [r for r in _rows(tmp_path) if r.get("kind") == "end"]
    assert end["reason"] == "plateau"
    assert latest_checkpoint(tmp_path).name == "step_000005"


def test_every_checkpoint_holds_the_cursor_of_every_batch_it_trained(tmp_path: Path) -> None:
    """Batches are marked consumed off the learner's path (a thread), yet each checkpoint's store
    cursor counts exactly the batches trained before it, and the store ends with all consumed."""
    torch.set_num_threads(1)
    steps = 6
    cfg = load_config(
        "math-tiny",
        [
            *BASE,
            "rollout.max_policy_lag=1",
            f"trainer.steps={steps}",
            "trainer.checkpoint_every=2",
            "trainer.keep_checkpoints=10",
        ],
    )
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok and res.steps == steps
    cursors = {}
    for ckpt in sorted((tmp_path / "checkpoints").glob("step_*")):
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)["trainer"]
        cursors[state["step"]] = state["extra"]["store_cursor"]
    assert cursors == {0: 0, 2: 2, 4: 4, 6: 6}  # step 0: the kept warm start
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    assert tree.cursor() == steps and tree.stats()["available"] == 0
    tree.close()


def test_hooks_given_as_a_list_compose(tmp_path: Path) -> None:
    """``hooks=[a, b]``: every hook of both runs, ``around_step`` nested with the first outermost,
    ``run_ended`` in reverse order; a list holding a rollout hook is refused with the process backend
    as a single one is."""
    from trainer.loop import Trainer, TrainerHooks

    calls: list[str] = []

    class Named(TrainerHooks):
        def __init__(self, name: str) -> None:
            self.name = name

        def run_started(self, trainer):
            calls.append(f"{self.name}.started")

        def around_step(self, step):
            calls.append(f"{self.name}.enter")
            stats = step()
            calls.append(f"{self.name}.exit")
            return stats

        def run_ended(self):
            calls.append(f"{self.name}.ended")

    class Counts(TrainerHooks):
        def episode_done(self, outcome):
            calls.append("episode")

    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=1"])
    with pytest.raises(ConfigError, match=r"Counts\.episode_done"):
        Trainer(cfg, tmp_path, console=False, hooks=[Named("a"), Counts()])
    res = Trainer(cfg, tmp_path, console=False, hooks=[Named("a"), Named("b")]).run()
    assert res.ok and res.steps == 1
    assert calls == ["a.started", "b.started", "a.enter", "b.enter", "b.exit", "a.exit", "b.ended", "a.ended"]
