"""Tree RL in ``fr-agents train``: branching episodes in the loop, J_max pruning, the tree baseline,
per-root packed steps, exact resume of a branching run."""

from __future__ import annotations

import copy
import json
import signal
import time
from pathlib import Path

import pytest
import torch

from fr_agents.config import load_config
from fr_agents.ledger import EpisodeLedger
from fr_agents.tree import TrajectoryTree
from fr_agents.tree.batch import build_flat, build_packed
from fr_agents.tree.store import STATE_PRUNED, keep_per_tree
from tests.trainer.learners import make_learner
from tests.trainer.test_learner import make_trajectories, moved, params_close, tiny_model
from tests.trainer.test_resume import (
    OVERRIDES,
    _steps_logged,
    _train,
    assert_resumed_run_matches,
    resume_point,
)
from trainer.loop import run_training
from trainer.metrics import MetricsSink
from trainer.objective import centered_advantages, node_value_advantages, tree_advantages

torch.set_num_threads(1)

# math-tiny as a two-attempt task: a wrong first answer gets feedback, and the episode forks there.
BRANCHING = [
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "env.kwargs={answer_format: plain, format_reward: 0.1, max_turns: 2}",
    "env.max_turns=2",
    "rollout.max_context=128",
    "rollout.branch_factor=2",
    "rollout.branch_at=[1]",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "trainer.checkpoint_every=0",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "trainer.plot_every=100",
    "trainer.collapse_guard=false",
    "warm_start.examples=0",
    "trainer.threads=1",
]


def _step_rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


# --------------------------------------------------------------------------- pruning (pure)


def test_keep_per_tree_merges_identical_siblings_and_respects_j_max_with_reward_diversity() -> None:
    # tree 0: leaf 11 reached twice (identical continuations), 3 distinct leaves <= J_max
    # tree 1: 6 distinct leaves, rewards 0,0,0,0,1,1 -> J_max=3 keeps both reward classes
    trees = [
        [(11, 0.0), (11, 0.0), (12, 1.0), (13, 0.0)],
        [(21, 0.0), (22, 0.0), (23, 0.0), (24, 0.0), (25, 1.0), (26, 1.0)],
    ]
    kept, counts, merged, capped = keep_per_tree(trees, 3)
    assert kept[0] == [11, 12, 13] and merged == 1
    assert counts[0] == [2, 1, 1]  # leaf 11 stands for both identical siblings
    assert len(kept[1]) == 3 and capped == 3 and counts[1] == [1, 1, 1]
    assert {r for leaf, r in trees[1] if leaf in kept[1]} == {0.0, 1.0}
    assert kept[1] == [21, 22, 25]  # round robin over reward classes, depth-first within each
    assert keep_per_tree(trees, 3) == (kept, counts, merged, capped)  # deterministic
    with pytest.raises(ValueError, match="max_per_root"):
        keep_per_tree(trees, 0)


MERGE_CONFIGS = [
    {"baseline": "batch"},
    {"baseline": "tree"},
    {"baseline": "tree", "negative_token_fraction": 0.5, "aggregation": "token_mean"},
    {"algo": "grpo"},
    {"baseline": "nodes", "negative_min_prob": 0.3, "negative_min_prob_scope": "suffix"},
]


@pytest.mark.parametrize(
    "switches", MERGE_CONFIGS, ids=["batch", "tree", "tree+filter+token_mean", "grpo", "nodes+min_prob"]
)
@pytest.mark.parametrize("form", ["flat", "packed"])
def test_a_merged_row_steps_exactly_like_its_identical_siblings_as_separate_rows(
    switches: dict, form: str
) -> None:
    """Merging identical siblings saves their compute and changes nothing else: one row of weight m
    gives the loss and gradients of m identical rows (baselines, denominators, GRPO groups)."""
    model = tiny_model()
    trajs = make_trajectories(model)
    ref = copy.deepcopy(model)
    counts = [1, 3, 1, 1, 2, 1, 1, 1]  # leaf 1 was sampled 3 times, leaf 4 twice
    separate = [t for t, c in zip(trajs, counts, strict=True) for _ in range(c)]
    kw = {"delta": 0.05, **switches}
    build = build_packed if form == "packed" else build_flat
    merged = build(trajs, "env", counts)
    assert merged.consumed is False and len((merged.flat if form == "packed" else merged).leaf_ids) == len(
        trajs
    )
    s_merged = make_learner(
        model, torch.optim.SGD(model.parameters(), lr=1e-2), micro_batch_tokens=24, tree_min_saving=0, **kw
    ).step(merged)
    s_sep = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), micro_batch_tokens=0, **kw).step(
        build_flat(separate)
    )
    assert s_sep["rows"] == len(separate) and s_merged["rows"] == len(trajs)
    for key in ("loss", "grad_norm"):
        assert s_merged[key] == pytest.approx(s_sep[key], rel=1e-7, abs=1e-10), key
    assert moved(ref, tiny_model()) > 1e-4  # the step really moved the weights
    params_close(model, ref, 1e-7)
    # dropping the duplicates instead (weight 1 each) is a different step
    plain = make_learner(copy.deepcopy(tiny_model()), lr=1e-2, **kw).step(build_flat(trajs))
    assert plain["loss"] != pytest.approx(s_sep["loss"], rel=1e-4)


def test_row_weights_are_refused_when_malformed_before_any_work() -> None:
    model = tiny_model()
    trajs = make_trajectories(model)
    with pytest.raises(ValueError, match="weights: expected 8"):
        build_flat(trajs, "env", [1, 2])
    assert build_flat(trajs, "env", [1] * 8).weights is None  # all ones: the plain batch
    before = copy.deepcopy(model)
    learner = make_learner(model, lr=1e-2, delta=0.05)
    for bad in ([1, 1, 1, 0, 1, 1, 1, 1], [1, 1, float("nan"), 1, 1, 1, 1, 1]):
        batch = build_flat(trajs, "env", bad)
        with pytest.raises(ValueError, match="weights: every row weight"):
            learner.step(batch)
        assert not batch.consumed
    params_close(model, before, 0.0)  # nothing stepped


# --------------------------------------------------------------------------- tree baseline


def test_tree_baseline_equals_a_plain_loop_over_the_tree() -> None:
    model = tiny_model()
    trajs = make_trajectories(model, rewards=[1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    flat = build_flat(trajs)
    got = tree_advantages(flat.rewards.to(torch.float64), flat.branch_rows)
    # the plain loop: find each leaf's branching node by walking the paths, then the formula
    rewards = [float(r) for r in flat.rewards]
    mean = sum(rewards) / len(rewards)
    expected = []
    for i, t in enumerate(trajs):
        node = None
        for n in t.path:
            if any(n in u.path for j, u in enumerate(trajs) if j != i):
                node = n
        siblings = [rewards[j] for j, u in enumerate(trajs) if node in u.path]
        local = sum(siblings) / len(siblings)
        expected.append(
            rewards[i] - mean
            if len(siblings) == 1
            else 0.5 * (rewards[i] - mean) + 0.5 * (rewards[i] - local)
        )
    # the paths: leaves 0,1,2 share node 3 under root 1 and leaf 3 forks at the root, etc.
    assert flat.branch_nodes[:4] == [3, 3, 3, 1]
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # without branching the tree baseline is the batch baseline
    linear = tree_advantages(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), [[], [], []])
    assert torch.allclose(linear, torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64))


# --------------------------------------------------------------------------- node values (nodes baseline)


def test_node_values_equal_the_mean_of_their_leaves_and_each_token_gets_its_branchs_value() -> None:
    """The nodes baseline against a plain walk of the tree: a node's value is the mean reward of the
    leaves under it; a token's advantage is its node's value minus that of the nearest node above
    with more leaves (the fork it chose a branch at), or minus the batch mean above the first fork."""
    model = tiny_model()
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    trajs = make_trajectories(model, rewards=rewards)
    flat = build_flat(trajs)
    width = flat.token_ids.shape[1]
    got = node_value_advantages(flat.rewards.to(torch.float64), flat.node_spans, width)
    leaves = {n: [i for i, t in enumerate(trajs) if n in t.path] for t in trajs for n in t.path}
    value = {n: sum(rewards[i] for i in rows) / len(rows) for n, rows in leaves.items()}
    assert (
        value[3] == pytest.approx(2 / 3)
        and value[1] == pytest.approx(0.5)
        and value[2] == pytest.approx(0.375)
    )
    mean = sum(rewards) / len(rewards)
    for i, t in enumerate(trajs):
        ends = [*t.offsets[1:], len(t.token_ids)]
        for k, (node, a, b) in enumerate(zip(t.path, t.offsets, ends, strict=True)):
            above = [m for m in t.path[:k] if len(leaves[m]) > len(leaves[node])]
            ref = value[above[-1]] if above else mean
            assert got[i, a:b].tolist() == pytest.approx([value[node] - ref] * (b - a)), (i, node)
    # leaf 0's own tail (node 4) is against the fork it left (node 3, three leaves), which is
    # against the prompt's tree (node 1, four leaves), which is against the batch
    t0 = trajs[0]
    assert got[0, t0.offsets[2]] == pytest.approx(1.0 - 2 / 3)
    assert got[0, t0.offsets[1]] == pytest.approx(2 / 3 - 0.5)
    assert got[0, 0] == pytest.approx(0.5 - mean)


def test_the_nodes_baseline_of_a_linear_batch_is_the_batch_baseline() -> None:
    """Without forks every node of a row holds that row alone: every token gets R_i - mean, and a
    learner step under baseline=nodes is the step under baseline=batch."""
    model = tiny_model()
    trajs = [t for t in make_trajectories(model) if t.leaf_id in (100, 104)]  # one leaf of each prompt
    flat = build_flat(trajs)
    got = node_value_advantages(flat.rewards.to(torch.float64), flat.node_spans, flat.token_ids.shape[1])
    row = centered_advantages(flat.rewards.to(torch.float64))
    for i in range(len(trajs)):
        real = flat.attention_mask[i]
        assert torch.allclose(got[i][real], row[i].expand(int(real.sum())))
    ref = copy.deepcopy(model)
    a = make_learner(model, torch.optim.SGD(model.parameters(), lr=1e-2), delta=0.05, baseline="nodes").step(
        build_flat(trajs)
    )
    b = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), delta=0.05, baseline="batch").step(
        build_flat(trajs)
    )
    for key in ("loss", "grad_norm", "adv_mean", "adv_max"):
        assert a[key] == pytest.approx(b[key], rel=1e-7, abs=1e-12), key
    params_close(model, ref, 1e-7)


def test_the_nodes_baseline_refuses_a_batch_without_paths_and_grpo() -> None:
    with pytest.raises(ValueError, match="node_spans"):
        node_value_advantages(torch.tensor([1.0, 0.0]), [[(1, 0, 3)], []], 3)
    from fr_agents.config import ConfigError

    with pytest.raises(ConfigError, match="objective.baseline"):
        load_config("math-tiny", ["objective.algo=grpo", "objective.baseline=nodes"])


# --------------------------------------------------------------------------- packed per root


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_per_root_packed_step_gradients_equal_flat_on_a_branching_batch(attn: str) -> None:
    model = tiny_model(attn)
    trajs = make_trajectories(model)
    ref = copy.deepcopy(model)
    packed = build_packed(trajs)
    assert len(packed.root_spans) == 2 and packed.max_root_tokens < packed.num_tokens
    # a budget that fits one root at a time: two per-root forwards, never the whole-batch mask
    budget = packed.max_root_tokens
    assert packed.root_chunks(budget) == [[0], [1]] or packed.root_chunks(budget) == [[1], [0]]
    kw = {"delta": 0.05, "baseline": "tree"}
    s_packed = make_learner(
        model,
        torch.optim.SGD(model.parameters(), lr=1e-2),
        micro_batch_tokens=budget,
        tree_min_saving=0,
        **kw,
    ).step(packed)  # tree attention even on these short rows
    s_flat = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), micro_batch_tokens=30, **kw).step(
        build_flat(trajs)
    )
    assert s_packed["packed"] == 1.0 and s_flat["packed"] == 0.0 and s_packed["micro_batches"] == 2
    assert s_packed["tree_attention"] == float(attn == "sdpa")
    assert s_packed["forward_tokens"] < sum(len(t.token_ids) for t in trajs)
    for key in ("loss", "grad_norm", "seq_kl_max", "ratio_mean"):
        assert s_packed[key] == pytest.approx(s_flat[key], rel=1e-6, abs=1e-9), key
    params_close(model, ref, 1e-6)


# --------------------------------------------------------------------------- the loop


def test_branching_episodes_in_the_training_loop(tmp_path: Path) -> None:
    steps = 3
    cfg = load_config("math-tiny", [*BRANCHING, f"trainer.steps={steps}"])
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok and res.steps == steps
    rows = _step_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["leaves_per_tree"] > 1.0 and r["sharing_ratio"] > 1.0 for r in rows)
    ledger, tree = EpisodeLedger(tmp_path / "episodes.sqlite"), TrajectoryTree.open(tmp_path / "store.sqlite")
    for k in range(steps):
        batch = ledger.batch_rows(k)
        episodes = [r[0] for r in batch]
        assert len(set(episodes)) == cfg.trainer.batch_size // 2  # batch_size counts leaves: 2 per tree
        assert len(batch) <= cfg.trainer.batch_size
        forked = [e for e in set(episodes) if episodes.count(e) == 2]
        assert forked, "some episode must fork at turn 1"
        a, b = tree.trajectories([r[1] for r in batch if r[0] == forked[0]])
        # the two branches share the prompt, the first reply and its feedback (one prefix), then differ
        shared = len(set(a.path) & set(b.path))
        assert shared >= 3 and a.path[:shared] == b.path[:shared] and a.leaf_id != b.leaf_id
        assert a.info["turns"] >= 1 and b.info["turns"] >= 1
        # the engine's count: a fork's shared part once, where the leaves' path tokens count it per leaf
        assert rows[k]["sampled_tokens"] == ledger.sampled_tokens(k) < sum(r[3] for r in batch)
        # nothing is capped at J_max=5 with 2 leaves a tree: the rows stand for every sampled leaf,
        # an identical sibling merged into its twin as one more sample of that row
        assert rows[k]["samples"] == len(batch)
        assert rows[k]["samples"] - rows[k]["leaves"] == rows[k]["merged"]
    stats = tree.stats()
    assert stats["available"] == 0, "every finished leaf is trained on or pruned, none left behind"
    ledger.close()
    tree.close()


def test_a_partially_scored_run_reports_the_reward_the_learner_trained_on(tmp_path: Path) -> None:
    """With ``rollout.reward: partial`` a cut leaf trains on its partial score: ``learner_reward`` is
    the mean of what the learner saw over the leaves it trained on, ``reward`` the env's."""
    cfg = load_config(
        "math-tiny", [*BRANCHING, "trainer.steps=2", "rollout.reward=partial", "rollout.max_context=40"]
    )  # most second attempts are cut by the context
    assert run_training(cfg, tmp_path, console=False).ok
    ledger, tree = EpisodeLedger(tmp_path / "episodes.sqlite"), TrajectoryTree.open(tmp_path / "store.sqlite")
    assert any(row["partial_scored"] for row in _step_rows(tmp_path)), (
        "the check needs partially scored leaves"
    )
    for k, row in enumerate(_step_rows(tmp_path)):
        trained = tree.trajectories(sorted({r[1] for r in ledger.batch_rows(k)}))
        assert row["partial_scored"] == sum(
            t.status != "finished" and t.partial_score is not None for t in trained
        )
        assert row["learner_reward"] == pytest.approx(
            sum(t.learner_reward("partial") for t in trained) / len(trained)
        )
        if row["partial_scored"]:  # the console shows it beside the env's reward
            assert "trained reward" in MetricsSink.progress_line(row)
    ledger.close()
    tree.close()


def test_branching_run_prunes_to_max_per_root_and_keeps_pruned_leaves(tmp_path: Path) -> None:
    cfg = load_config("math-tiny", [*BRANCHING, "trainer.steps=2", "trainer.max_per_root=1"])
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok
    rows = _step_rows(tmp_path)
    assert sum(r["pruned"] for r in rows) > 0
    assert all(r["leaves"] == cfg.trainer.batch_size // 2 for r in rows)  # one leaf per tree trained on
    ledger, tree = EpisodeLedger(tmp_path / "episodes.sqlite"), TrajectoryTree.open(tmp_path / "store.sqlite")
    leaves = [r[1] for k in range(2) for r in ledger.batch_rows(k)]
    stats = tree.stats()
    # merged siblings are the kept leaf itself; the leaves cut by J_max are marked pruned
    assert stats["pruned"] == sum(r["pruned"] - r["merged"] for r in rows) > 0
    with tree._db.read() as c:  # pruned leaves stay in the store, marked
        states = dict(
            c.execute(f"SELECT id, state FROM leaves WHERE id IN ({','.join(map(str, leaves))})").fetchall()
        )
    pruned = [leaf for leaf, s in states.items() if s == STATE_PRUNED]
    assert len(pruned) == stats["pruned"] > 0
    assert all(tree.trajectory(leaf).token_ids for leaf in pruned)
    ledger.close()
    tree.close()


@pytest.mark.timeout(900)
def test_sigkill_then_resume_of_a_branching_run_matches_uninterrupted(tmp_path: Path) -> None:
    branching = [
        "env.kwargs={answer_format: plain, format_reward: 0.1, max_turns: 2}",
        "env.max_turns=2",
        "rollout.max_context=128",
        "rollout.branch_factor=2",
        "rollout.branch_at=[1]",
        "trainer.max_per_root=1",
        "objective.baseline=tree",
    ]
    over = [o for o in OVERRIDES if not o.startswith("env.kwargs")] + branching
    a, b = tmp_path / "a", tmp_path / "b"
    pa = _train(["math-tiny", *over, "--run-dir", str(a)])
    out_a, _ = pa.communicate(timeout=600)
    assert pa.returncode == 0, out_a
    assert any(r["leaves_per_tree"] > 1 for r in _step_rows(a))

    pb = _train(["math-tiny", *over, "--run-dir", str(b)])
    deadline = time.monotonic() + 600
    while _steps_logged(b) < 3 and time.monotonic() < deadline and pb.poll() is None:
        time.sleep(0.05)
    assert pb.poll() is None, "run B ended before it could be killed mid-run"
    pb.send_signal(signal.SIGKILL)
    pb.communicate(timeout=60)
    assert 3 <= _steps_logged(b) < 6
    resumed_from = resume_point(b)
    pr = _train(["--resume", str(b)])
    out_r, _ = pr.communicate(timeout=600)
    assert pr.returncode == 0, out_r
    assert_resumed_run_matches(a, b, resumed_from)
    # the same leaves were pruned in both runs
    ta, tb = TrajectoryTree.open(a / "store.sqlite"), TrajectoryTree.open(b / "store.sqlite")
    assert ta.stats()["pruned"] == tb.stats()["pruned"] > 0
    ta.close()
    tb.close()


def test_ledger_of_a_run_from_before_branching_still_reads(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "episodes.sqlite"
    with sqlite3.connect(path) as c:  # the one-leaf-per-episode schema
        c.execute(
            "CREATE TABLE episodes (episode INTEGER PRIMARY KEY, batch INTEGER NOT NULL, leaf INTEGER "
            "NOT NULL, reward REAL NOT NULL, tokens INTEGER NOT NULL, version INTEGER NOT NULL)"
        )
        c.executemany(
            "INSERT INTO episodes VALUES (?,?,?,?,?,?)", [(0, 0, 7, 1.0, 3, 0), (1, 0, 9, 0.0, 4, 0)]
        )
    ledger = EpisodeLedger(path)
    assert ledger.batch_rows(0) == [(0, 7, 1.0, 3, 0), (1, 9, 0.0, 4, 0)]
    assert ledger.leaves([0, 1, 2]) == {0: 7, 1: 9}
    ledger.record_episode(2, 1, [(11, 0.5, 2), (12, 1.0, 2)], 1)
    assert [r[1] for r in ledger.batch_rows(1)] == [11, 12]
    ledger.close()
    assert EpisodeLedger(path).batch_rows(0)[0] == (0, 7, 1.0, 3, 0)  # reopening is a no-op


def test_a_ledger_from_before_the_sampled_count_gains_the_column_and_reports_it_unknown(
    tmp_path: Path,
) -> None:
    import sqlite3

    path = tmp_path / "episodes.sqlite"
    with sqlite3.connect(path) as c:  # the schema before the engine's token count
        c.execute(
            "CREATE TABLE episode_leaves (episode INTEGER NOT NULL, branch INTEGER NOT NULL, "
            "batch INTEGER NOT NULL, leaf INTEGER NOT NULL, reward REAL NOT NULL, tokens "
            "INTEGER NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (episode, branch))"
        )
        c.execute("INSERT INTO episode_leaves VALUES (0, 0, 0, 7, 1.0, 3, 0)")
    ledger = EpisodeLedger(path)
    assert ledger.batch_rows(0) == [(0, 7, 1.0, 3, 0)]
    assert ledger.sampled_tokens(0) is None, "rows written before the count do not know it"
    ledger.record_episode(
        1, 1, [(11, 0.5, 5, 5), (12, 1.0, 5, 2)], 1
    )  # a fork: 3 shared tokens, counted once
    assert ledger.sampled_tokens(1) == 7 and ledger.sampled_tokens(2) is None
    ledger.close()
