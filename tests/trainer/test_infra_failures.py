"""An infrastructure failure is not a zero: a leaf whose grading could not happen is stored
``aborted``, left out of the batch and of its baseline, the episode is run again (same seed), and
the step's metrics count it; an episode whose every attempt aborted adds nothing to its batch, and a
run whose grader always fails still ends.

The runs here grade in a real bwrap sandbox (``infra_envs``) and kill that sandbox for real while
the grader's program runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import infra_envs
import pytest
import torch

from fr_agents.config import load_config
from fr_agents.ledger import EpisodeLedger
from fr_agents.tree import TrajectoryTree
from tools_sandbox import live_sessions
from tools_sandbox.bwrap import bwrap_available
from trainer.batches import export_batch
from trainer.loop import Trainer
from trainer.objective import centered_advantages

BASE = [
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "trainer.batch_size=4",
    "trainer.checkpoint_every=0",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "trainer.collapse_guard=false",
    "warm_start.examples=0",
    "trainer.threads=1",
    "trainer.backend=local",
    "rollout.max_policy_lag=0",
    "rollout.max_new_tokens=4",
    "env.id=infra_envs:fr_agents_test/SandboxGraded-v0",
]

pytestmark = pytest.mark.bwrap


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"bwrap backend unavailable: {why}")


def _steps(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def test_a_sandbox_killed_mid_grade_is_retried_and_left_out_of_the_batch_and_its_baseline(
    tmp_path: Path,
) -> None:
    """One episode at a time, so the kills land in order: episode 0's two attempts are killed
    (``max_infra_retries`` 1: it is lost), episode 1's first attempt is killed and its retry
    grades; episodes 2 and 3 and batch 1 grade normally."""
    torch.set_num_threads(1)
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    cfg = load_config(
        "math-tiny",
        [
            *BASE,
            "trainer.steps=2",
            "rollout.concurrency=1",
            "rollout.max_infra_retries=1",
            f"env.kwargs={{kills: 3, ticket_dir: {tickets}}}",
        ],
    )
    killed_before = infra_envs.SandboxGradedEnv.killed
    trainer = Trainer(cfg, tmp_path / "run", console=False)
    res = trainer.run()
    assert res.ok and res.steps == 2
    assert infra_envs.SandboxGradedEnv.killed - killed_before == 3  # three real kills
    assert live_sessions() == []  # no sandbox outlives its episode, killed or not

    run = tmp_path / "run"
    ledger, tree = EpisodeLedger(run / "episodes.sqlite"), TrajectoryTree.open(run / "store.sqlite")
    # the ledger: every attempt's leaf has one row; batch 0 trains episodes 1-3, episode 0 is done (lost)
    aborts = ledger.aborted_rows(0)
    assert [(e, a, why) for e, a, _, why in aborts] == [
        (0, 0, "sandbox_died"),
        (0, 1, "sandbox_died"),
        (1, 0, "sandbox_died"),
    ]
    rows = ledger.batch_rows(0)
    assert [r[0] for r in rows] == [1, 2, 3] and ledger.done(range(4)) == {0, 1, 2, 3}
    assert len(ledger.batch_rows(1)) == 4 and ledger.aborted_rows(1) == []
    # the store keeps what was sampled: episode 0's path stays aborted, with the reason
    (lost,) = tree.trajectories([aborts[0][2]])
    assert (
        lost.status == "aborted" and lost.info["aborted_by"] == "sandbox_died" and sum(lost.policy_mask) > 0
    )
    # the retry ran with the same seed, so it sampled the same path: that leaf is now graded
    retried = next(r for r in rows if r[0] == 1)
    assert retried[1] == aborts[2][2]
    (graded,) = tree.trajectories([retried[1]])
    assert graded.status == "finished" and graded.info["aborted_before"] == ["sandbox_died"]
    assert tree.stats()["aborted"] >= 1 and tree.stats()["available"] == 0  # trained or aborted, nothing left

    # the batch the learner got: the trained rows only; its baseline is their mean
    schedule = trainer.rollout_side.schedule
    assert [s.episode for s in schedule.episodes(0)] == [0, 1, 2, 3]
    batch, leaves, kept, trees = export_batch(0, cfg, schedule, ledger, tree)
    assert [r[0] for r in kept] == [1, 2, 3] and lost.leaf_id not in leaves
    assert batch.rewards.tolist() == [r[2] for r in rows]
    adv = centered_advantages(batch.rewards.double())
    mean = sum(r[2] for r in rows) / 3
    assert adv.tolist() == pytest.approx([r[2] - mean for r in rows])
    assert (trees.aborted, trees.aborted_episodes, trees.abort_reasons) == (3, 1, {"sandbox_died": 3})
    ledger.close()
    tree.close()

    # the step's metrics count them; the objective's rows are the trained ones
    first, second = _steps(run)
    assert (
        first["aborted"] == 3
        and first["aborted_episodes"] == 1
        and first["abort_reasons"] == {"sandbox_died": 3}
    )
    assert first["leaves"] == 3 and first["reward"] == pytest.approx(mean)
    assert second["aborted"] == 0 and second["aborted_episodes"] == 0 and second["leaves"] == 4
    from trainer.metrics import MetricsSink

    assert "aborted 3 leaves: sandbox_died 3, 1 episodes lost" in MetricsSink.progress_line(first)
    assert "aborted" not in MetricsSink.progress_line(second)


def test_a_failure_that_passes_leaves_the_training_data_and_the_weights_as_without_it(tmp_path: Path) -> None:
    """The same run twice, once with episode 0's first grade killed: its retry requests the same
    seeds, so both runs train on the same tokens and rewards and end with equal weights."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    trained = {}
    for name, kills in (("clean", 0), ("killed", 1)):
        tickets = tmp_path / f"tickets_{name}"
        tickets.mkdir()
        cfg = load_config(
            "math-tiny",
            [
                *BASE,
                "trainer.steps=2",
                "rollout.concurrency=1",
                "rollout.max_infra_retries=1",
                f"env.kwargs={{kills: {kills}, ticket_dir: {tickets}}}",
            ],
        )
        run = tmp_path / name
        assert Trainer(cfg, run, console=False).run().ok
        ledger, tree = EpisodeLedger(run / "episodes.sqlite"), TrajectoryTree.open(run / "store.sqlite")
        data = []
        for k in range(2):
            rows = ledger.batch_rows(k)
            data.append(
                [
                    (r[0], r[2], t.token_ids, t.logprobs)
                    for r, t in zip(rows, tree.trajectories([r[1] for r in rows]), strict=True)
                ]
            )
        trained[name] = (
            data,
            len(ledger.aborted_rows(0)),
            load_file(run / "checkpoints" / "step_000002" / "model.safetensors"),
        )
        ledger.close()
        tree.close()
    (clean, clean_aborts, clean_w), (killed, killed_aborts, killed_w) = trained["clean"], trained["killed"]
    assert (clean_aborts, killed_aborts) == (0, 1)
    assert killed == clean and [len(b) for b in clean] == [4, 4]
    assert all(torch.equal(clean_w[k], killed_w[k]) for k in clean_w)


def test_a_grader_that_always_fails_does_not_block_the_run(tmp_path: Path) -> None:
    """Every grade's sandbox is killed: each episode aborts every attempt, each batch is empty,
    and the run still takes its steps (weights unchanged) and reports what aborted. The rollout
    runs in its own process here (the other runs keep it in the learner's)."""
    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny",
        [
            *BASE,
            "trainer.steps=2",
            "rollout.concurrency=4",
            "rollout.max_infra_retries=1",
            "env.kwargs={kills: -1}",
            "trainer.keep_checkpoints=10",
            "trainer.backend=process",  # the default backend
        ],
    )
    trainer = Trainer(cfg, tmp_path, console=False)
    res = trainer.run()
    assert res.ok and res.steps == 2 and trainer.learner.version == 2
    from safetensors.torch import load_file

    start, end = (
        load_file(tmp_path / "checkpoints" / f"step_00000{k}" / "model.safetensors") for k in (0, 2)
    )
    assert all(torch.equal(start[k], end[k]) for k in start)  # nothing was trained on
    for row in _steps(tmp_path):
        assert row["aborted"] == 8 and row["aborted_episodes"] == 4  # 4 episodes x 2 attempts
        assert row["leaves"] == 0 and math.isnan(row["reward"]) and row["tokens"] == 0
    ledger = EpisodeLedger(tmp_path / "episodes.sqlite")
    assert ledger.batch_rows(0) == [] and ledger.done(range(8)) == set(range(8))
    ledger.close()
    assert live_sessions() == []


TASK = {"id": "arith-6+9", "prompt": "6+9=", "answer": "15"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fr_agents.models import create_tiny

    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def _episode(tiny, tmp_path: Path, options, **env_kwargs):
    """One episode of SandboxGraded-v0 through the rollout (no trainer), one kill where told."""
    import asyncio

    import gymnasium

    from fr_agents.policy.hf import HFEngine
    from fr_agents.rollout import run_episode

    model, tok = tiny
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    engine, tree = HFEngine(model, tok, seed=0), TrajectoryTree()
    make = lambda: gymnasium.make(  # noqa: E731
        "fr_agents_test/SandboxGraded-v0", kills=1, ticket_dir=str(tickets), **env_kwargs
    )
    killed = infra_envs.SandboxGradedEnv.killed
    try:
        res = asyncio.run(run_episode(None, engine, tok, tree, options, seed=0, task=TASK, make_env=make))
    finally:
        engine.close_sync()
    assert infra_envs.SandboxGradedEnv.killed == killed + 1  # one real kill
    return res, tree


def test_a_cut_branch_whose_partial_score_cannot_be_graded_ends_aborted(tiny, tmp_path: Path) -> None:
    from fr_agents.rollout import RolloutOptions

    torch.set_num_threads(1)
    opts = RolloutOptions(max_new_tokens=4, max_context=256, max_turns=1)
    res, tree = _episode(tiny, tmp_path, opts, kill_in="partial", turns=3)
    (leaf,) = res.leaves
    assert leaf.status == "aborted" and leaf.partial_score is None
    assert leaf.info["truncated_by"] == "max_turns" and leaf.info["aborted_by"] == "sandbox_died"
    stored = tree.trajectory(leaf.leaf_id)  # what was sampled stays recorded
    assert stored.status == "aborted" and sum(stored.policy_mask) == leaf.policy_tokens > 0
    assert live_sessions() == []


def test_a_fork_that_gets_no_sandbox_ends_its_branch_aborted(tiny, tmp_path: Path) -> None:
    from fr_agents.rollout import RolloutOptions

    torch.set_num_threads(1)
    opts = RolloutOptions(max_new_tokens=4, max_context=256, max_turns=2, branch_factor=2, branch_at=(1,))
    res, tree = _episode(tiny, tmp_path, opts, kill_in="fork", turns=2)
    (leaf,) = res.leaves  # the fork failed: the branch ends where it was to fork
    assert leaf.status == "aborted" and leaf.turns == 1 and leaf.info["aborted_by"] == "sandbox_start"
    assert tree.trajectory(leaf.leaf_id).info["aborted_by"] == "sandbox_start"
    assert live_sessions() == []
