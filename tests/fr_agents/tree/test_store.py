"""TrajectoryTree behaviour: sharing, validation, consumption, pruning, compaction, CLI."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest

from fr_agents.cli import main as cli_main
from fr_agents.tree import DuplicateLeafError, TrajectoryTree


def _pol(n: int, base: float = -0.5) -> list[float]:
    return [base - 0.01 * i for i in range(n)]


@pytest.fixture(params=["memory", "file"])
def tree(request, tmp_path):
    t = TrajectoryTree() if request.param == "memory" else TrajectoryTree.open(tmp_path / "s.db")
    yield t
    t.close()


def test_trajectory_roundtrip_and_fields(tree):
    r = tree.add_root([1, 2, 3], meta={"task": "t1"})
    a = tree.append(r, [10, 11], _pol(2), True, 3)
    o = tree.append(a, [20, 21, 22], None, False, 3)
    leaf = tree.finish(o, 1.5, partial_score=0.25, status="truncated", info={"turns": 1})
    t = tree.trajectory(leaf)
    assert t.token_ids == [1, 2, 3, 10, 11, 20, 21, 22]
    assert t.policy_mask == [False] * 3 + [True] * 2 + [False] * 3
    assert t.versions == [-1, -1, -1, 3, 3, -1, -1, -1]
    assert t.logprobs[3:5] == pytest.approx(_pol(2))
    assert t.logprobs[:3] == [0.0] * 3 and t.logprobs[5:] == [0.0] * 3
    assert (t.reward, t.partial_score, t.status, t.info) == (1.5, 0.25, "truncated", {"turns": 1})
    assert t.learner_reward("env") == 1.5 and t.learner_reward("partial") == 0.25
    assert tree.root_meta(r) == {"task": "t1"}
    assert tree.leaf_ids() == [leaf]


def test_identical_prompts_share_one_root(tree):
    assert tree.add_root([5, 6]) == tree.add_root([5, 6])
    assert tree.add_root([5, 6]) != tree.add_root([5, 6, 7])
    assert tree.stats()["roots"] == 2


def test_shared_prefix_is_stored_once_and_split(tree):
    r = tree.add_root([1])
    lp = _pol(6)
    a = tree.append(r, [2, 3, 4, 5, 6, 7], lp, True, 0)
    b = tree.append(r, [2, 3, 4, 9], lp[:3] + [-2.0], True, 0)  # shares 3 tokens: splits a
    c = tree.append(r, [2, 3], lp[:2], True, 0)  # ends inside the shared head: splits again
    for n in (a, b, c):
        tree.finish(n, 1.0)
    s = tree.stats()
    assert s["stored_tokens"] == 1 + 6 + 1  # root, a's run, b's own token
    assert s["logical_tokens"] == 7 + 5 + 3
    assert tree.trajectory(a).token_ids == [1, 2, 3, 4, 5, 6, 7]
    assert tree.trajectory(b).token_ids == [1, 2, 3, 4, 9]
    assert tree.trajectory(c).token_ids == [1, 2, 3]
    # a kept its id through the splits; c is now an inner node that is also a leaf
    assert tree.node(a).token_ids == [5, 6, 7]
    assert tree.children(c) != []


def test_different_logprobs_or_versions_are_different_samples(tree):
    r = tree.add_root([1])
    a = tree.append(r, [2, 3], [-0.1, -0.2], True, 0)
    b = tree.append(r, [2, 3], [-0.1, -0.3], True, 0)  # second token differs in log-prob
    c = tree.append(r, [2, 3], [-0.1, -0.2], True, 1)  # other version: nothing shared
    d = tree.append(r, [2, 3], [-0.1, -0.2], True, 0)  # the very same sample as a
    assert len({a, b, c}) == 3 and d == a
    assert tree.stats()["stored_tokens"] == 1 + 2 + 1 + 2


def test_env_tokens_share_across_versions(tree):
    r = tree.add_root([1])
    a = tree.append(r, [7, 8], None, False, 4)
    b = tree.append(r, [7, 8], None, False, 9)
    assert a == b


def test_fork_is_a_second_append(tree):
    r = tree.add_root([1])
    turn = tree.append(r, [2], [-0.5], True, 0)
    obs = tree.append(turn, [3, 4], None, False, 0)
    x = tree.finish(tree.append(obs, [5], [-0.1], True, 0), 1.0)
    y = tree.finish(tree.append(obs, [6], [-0.2], True, 0), 0.0)
    assert tree.trajectory(x).token_ids[:4] == tree.trajectory(y).token_ids[:4] == [1, 2, 3, 4]
    assert tree.stats()["stored_tokens"] == 6


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(token_ids=[1, 2], logprobs=[-1.0], policy_mask=True), "logprobs"),
        (dict(token_ids=[1, 2], logprobs=[-1.0, -1.0], policy_mask=[True]), "policy_mask"),
        (dict(token_ids=[1, 2], logprobs=[-1.0, 0.5], policy_mask=True), "logprobs"),
        (dict(token_ids=[1, 2], logprobs=[-1.0, float("nan")], policy_mask=True), "logprobs"),
        (dict(token_ids=[], logprobs=[], policy_mask=True), "token_ids"),
        (dict(token_ids=[1, -2], logprobs=[-1.0, -1.0], policy_mask=True), "token_ids"),
        (dict(token_ids=[1], logprobs=None, policy_mask=True), "logprobs"),
        (dict(token_ids=[1], logprobs=[-1.0], policy_mask=True, version=-1), "version"),
        (dict(token_ids=[1], logprobs=[-1.0], policy_mask=True, parent=999), "parent"),
    ],
)
def test_bad_append_raises_naming_field_and_writes_nothing(tree, kwargs, field):
    r = tree.add_root([1])
    before = tree.stats()
    args = dict(parent=r, version=0) | kwargs
    with pytest.raises(ValueError, match=field):
        tree.append(**args)
    assert tree.stats() == before


def test_positive_logprob_allowed_on_env_tokens(tree):
    r = tree.add_root([1])
    n = tree.append(r, [2, 3], [0.7, -0.1], [False, True], 0)
    assert tree.node(n).segment.logprobs.tolist() == pytest.approx([0.0, -0.1])


def test_finish_validation_and_twice(tree):
    r = tree.add_root([1])
    n = tree.append(r, [2], [-0.1], True, 0)
    before = tree.stats()
    for kwargs, field in [
        (dict(node=12345, reward=1.0), "node"),
        (dict(node=r, reward=1.0), "node"),
        (dict(node=n, reward=float("inf")), "reward"),
        (dict(node=n, reward=1.0, partial_score=1.5), "partial_score"),
        (dict(node=n, reward=1.0, status="done"), "status"),
        (dict(node=n, reward=1.0, info={"x": object()}), "info"),
    ]:
        with pytest.raises(ValueError, match=field):
            tree.finish(**kwargs)
    assert tree.stats() == before
    leaf = tree.finish(n, 1.0)
    with pytest.raises(DuplicateLeafError, match="node") as e:
        tree.finish(n, 0.0)
    assert e.value.leaf_id == leaf and tree.trajectory(leaf).reward == 1.0


def test_an_aborted_path_gets_its_outcome_from_the_attempt_that_grades_it(tree):
    """A path stored ``aborted`` (its grading could not happen) has no outcome yet: the first
    finish with another status gives it one; a graded path keeps its own against a later abort."""
    r = tree.add_root([1])
    n = tree.append(r, [2, 3], [-0.1, -0.2], True, 0)
    leaf = tree.finish(n, 0.0, status="aborted", info={"aborted_by": "sandbox_died"})
    assert tree.stats()["aborted"] == 1 and tree.stats()["available"] == 0
    assert tree.take_batch(1, allow_partial=True) is None  # never handed out to train on
    with pytest.raises(DuplicateLeafError):  # aborted again: still no outcome
        tree.finish(n, 0.0, status="aborted", info={"aborted_by": "grader_timeout"})
    assert tree.finish(n, 1.0, info={"turns": 1}) == leaf  # the retry's grade, on the same stored tokens
    t = tree.trajectory(leaf)
    assert (t.status, t.reward, t.info) == ("finished", 1.0, {"turns": 1, "aborted_before": ["sandbox_died"]})
    assert t.token_ids == [1, 2, 3] and tree.stats()["aborted"] == 0 and tree.stats()["available"] == 1
    with pytest.raises(DuplicateLeafError):  # a graded path keeps its outcome
        tree.finish(n, 0.0, status="aborted", info={"aborted_by": "sandbox_died"})
    assert tree.trajectory(leaf).status == "finished"


def test_take_batch_bounds_order_and_consumption(tree):
    leaves = {}
    for p in range(3):
        r = tree.add_root([100 + p])
        for k in range(7):
            n = tree.append(r, [k + 1], [-0.1 * (k + 1)], True, 0)
            leaves[tree.finish(n, float(k % 2))] = r
    first = tree.take_batch(8, max_per_root=3)
    assert first is not None and len(first) == 8
    roots = [leaves[x] for x in first]
    assert max(roots.count(r) for r in set(roots)) <= 3
    assert first[:3] == sorted(first[:3])  # oldest first
    taken = set(first)
    while (b := tree.take_batch(2, max_per_root=3, allow_partial=True)) is not None:
        assert not taken & set(b)
        taken |= set(b)
    assert taken == set(leaves) and tree.unconsumed_count() == 0
    assert tree.take_batch(1) is None


def test_take_batch_orders_by_episode_start_not_finish(tree):
    r = tree.add_root([1])
    long_ep = tree.append(r, [2], [-0.1], True, 0)  # starts first, finishes last
    short_ep = tree.append(r, [3], [-0.1], True, 0)
    tree.finish(short_ep, 1.0)
    long_ep = tree.append(long_ep, [4, 5, 6], [-0.1] * 3, True, 0)
    tree.finish(long_ep, 1.0)
    assert tree.take_batch(1) == [long_ep]


def test_take_batch_not_enough_returns_none_and_consumes_nothing(tree):
    r = tree.add_root([1])
    tree.finish(tree.append(r, [2], [-0.1], True, 0), 1.0)
    assert tree.take_batch(2) is None
    assert tree.unconsumed_count() == 1
    assert tree.take_batch(2, allow_partial=True) is not None


def test_max_lag_marks_stale_and_versions(tree):
    r = tree.add_root([1])
    for v in range(5):
        tree.finish(tree.append(r, [2 + v], [-0.1], True, v), 1.0)
    assert tree.oldest_unconsumed_version() == 0
    with pytest.raises(ValueError, match="current_version"):
        tree.take_batch(1, max_lag=1)
    got = tree.take_batch(5, max_per_root=5, max_lag=1, current_version=4, allow_partial=True)
    assert got is not None and len(got) == 2
    assert {tree.trajectory(x).versions[-1] for x in got} == {3, 4}
    assert tree.stats()["stale"] == 3 and tree.oldest_unconsumed_version() is None


def test_cursor_mark_consumed_and_rewind(tree):
    r = tree.add_root([1])
    ids = [tree.finish(tree.append(r, [2 + k], [-0.1], True, 0), 1.0) for k in range(4)]
    tree.mark_consumed(ids[:2])
    ckpt = tree.cursor()
    with pytest.raises(ValueError, match="leaf_ids"):
        tree.mark_consumed([ids[0]])
    assert tree.take_batch(2) == ids[2:]
    assert tree.cursor() == ckpt + 1 and tree.unconsumed_count() == 0
    assert tree.rewind(ckpt) == 2
    assert tree.take_batch(2, consume=False) == ids[2:]
    assert tree.unconsumed_count() == 2


def test_marking_several_batches_at_once_numbers_them_as_one_call_each(tree, tmp_path):
    r = tree.add_root([1])
    ids = [tree.finish(tree.append(r, [2 + k], [-0.1], True, 0), 1.0) for k in range(6)]
    assert tree.mark_consumed_batches([ids[:2], ids[2:3], ids[3:5]]) == 3
    one = TrajectoryTree.open(tmp_path / "one.sqlite")
    r1 = one.add_root([1])
    ids1 = [one.finish(one.append(r1, [2 + k], [-0.1], True, 0), 1.0) for k in range(6)]
    for part in (ids1[:2], ids1[2:3], ids1[3:5]):
        one.mark_consumed(part)

    def numbers(t, leaves):
        with t._db.read() as c:
            return [
                c.execute("SELECT consumed_seq FROM leaves WHERE id = ?", (i,)).fetchone()[0] for i in leaves
            ]

    assert numbers(tree, ids) == numbers(one, ids1) == [1, 1, 2, 3, 3, None]
    assert tree.rewind(1) == 3 and tree.unconsumed_count() == 4  # batches 2 and 3 are available again
    before = tree.cursor()
    with pytest.raises(ValueError, match="not available"):  # the second batch is refused: nothing written
        tree.mark_consumed_batches([ids[2:3], ids[:1]])
    assert tree.cursor() == before and tree.unconsumed_count() == 4
    with pytest.raises(ValueError, match="batches: empty"):
        tree.mark_consumed_batches([])
    one.close()


def test_open_paths_track_inflight_tips(tree):
    r = tree.add_root([1])
    a = tree.append(r, [2], [-0.1], True, 0)
    b = tree.append(r, [3], [-0.1], True, 0)
    assert tree.open_paths() == [a, b]
    a2 = tree.append(a, [4], None, False, 0)
    tree.finish(b, 1.0)
    assert tree.open_paths() == [a2]


def test_partial_reward_and_failures_in_export(tree):
    r = tree.add_root([1])
    ok = tree.finish(tree.append(r, [2], [-0.1], True, 0), 1.0)
    bad = tree.finish(tree.append(r, [3], [-0.1], True, 0), 0.0)
    cut = tree.finish(tree.append(r, [4], [-0.1], True, 0), 0.0, partial_score=0.6, status="truncated")
    env = tree.export_flat([ok, bad, cut], reward="env")
    part = tree.export_flat([ok, bad, cut], reward="partial")
    assert env.rewards.tolist() == [1.0, 0.0, 0.0]
    assert part.rewards.tolist() == pytest.approx([1.0, 0.0, 0.6])
    assert part.failures.tolist() == [False, True, True]
    with pytest.raises(ValueError, match="reward"):
        tree.export_flat([ok], reward="best")


def test_progress_reward_pays_a_cut_row_up_to_the_reply_after_which_its_score_reached_its_best(tree):
    """``reward="progress"``: a cut leaf's partial score pays its replies up to ``progress_turn``
    (the runs of policy tokens, observations between them); a won leaf, a cut leaf whose steps
    reported no progress turn, and the other reward modes pay every token."""
    r = tree.add_root([1, 1])  # prompt: tokens 0-1

    first = iter(range(100, 1000, 100))

    def episode(replies: int, **finish) -> int:
        node, own = r, next(first)  # each episode its own first token: no shared node
        for k in range(replies):  # reply k: 2 policy tokens, then a 1-token observation
            node = tree.append(node, [own + k, 20 + k], [-0.1, -0.1], True, 0)
            node = tree.append(node, [30 + k], None, False, -1)
        return tree.finish(node, **finish)

    # 4 replies, the score reached its best after the 2nd: replies 3 and 4 (from token 2 + 2*3 = 8) earn 0
    looped = episode(4, reward=0.0, partial_score=0.5, status="truncated", info={"progress_turn": 2})
    won = episode(2, reward=1.0, info={"progress_turn": 2})
    unknown = episode(3, reward=0.0, partial_score=0.5, status="truncated", info={})
    never = episode(3, reward=0.0, partial_score=0.0, status="truncated", info={"progress_turn": 0})
    batch = tree.export_flat([looped, won, unknown, never], reward="progress")
    assert batch.rewards.tolist() == pytest.approx([0.5, 1.0, 0.5, 0.0])
    assert batch.credit_ends.tolist() == [8, 8, 11, 2]  # won: its 8 tokens; never: from its first reply
    assert tree.export_flat([looped, won], reward="partial").credit_ends is None
    assert tree.export_packed([looped, won], reward="progress").flat.credit_ends.tolist() == [8, 8]


def test_flat_batch_consumed_flag(tree):
    r = tree.add_root([1])
    leaf = tree.finish(tree.append(r, [2], [-0.1], True, 0), 1.0)
    fb = tree.export_flat([leaf])
    pb = tree.export_packed([leaf])
    assert not fb.consumed
    fb.mark_consumed()
    with pytest.raises(RuntimeError):
        fb.mark_consumed()
    pb.mark_consumed()
    assert pb.consumed and pb.flat.consumed


def test_pruning_identical_actions_and_observations(tree):
    r = tree.add_root([1])
    # Same action tokens sampled under another version: a different sample, same action.
    a = tree.finish(tree.append(r, [5, 6], [-0.1, -0.2], True, 0), 1.0)
    b = tree.finish(tree.append(r, [5, 6], [-0.3, -0.4], True, 1), 1.0)

    # Two-turn episodes with different actions but the same observation.
    def two_turn(act1: int, act2: int) -> int:
        n = tree.append(r, [act1], [-0.5], True, 0)
        n = tree.append(n, [90, 91], None, False, 0)
        return tree.finish(tree.append(n, [act2], [-0.5], True, 0), 0.0)

    c, d = two_turn(7, 8), two_turn(9, 10)
    e = tree.finish(tree.append(r, [11], [-0.5], True, 0), 0.0)  # single-turn: kept
    f = tree.finish(tree.append(r, [12], [-0.5], True, 0), 0.0)
    got = tree.take_batch(6, allow_partial=True)
    assert got is not None and set(got) == {a, c, e, f}
    assert tree.stats()["pruned"] == 2
    assert b not in got and d not in got


def test_pruning_with_text_normaliser():
    tree = TrajectoryTree(normalize_action=lambda ids: tuple(i % 100 for i in ids))
    r = tree.add_root([1])
    tree.finish(tree.append(r, [105], [-0.1], True, 0), 1.0)
    tree.finish(tree.append(r, [205], [-0.1], True, 0), 1.0)
    assert tree.prune() == 1


def test_compact_removes_consumed_subtrees_only(tree):
    r1, r2 = tree.add_root([1]), tree.add_root([2])
    a = tree.finish(tree.append(r1, [3, 4, 5], [-0.1] * 3, True, 0), 1.0)
    b = tree.finish(tree.append(r2, [6, 7], [-0.1] * 2, True, 0), 1.0)
    inflight = tree.append(r1, [8], [-0.2], True, 0)
    assert tree.take_batch(1) == [a]
    before = tree.stats()["stored_tokens"]
    assert tree.compact() == 1
    s = tree.stats()
    assert s["stored_tokens"] == before - 3 and s["compacted_leaves"] == 1
    assert tree.leaf_ids() == [b]
    assert tree.trajectory(b).token_ids == [2, 6, 7]
    assert tree.finish(tree.append(inflight, [9], [-0.1], True, 0), 1.0)


def test_durable_reopen_and_threads(tmp_path):
    path = tmp_path / "t.db"
    with TrajectoryTree.open(path) as tree:
        r = tree.add_root([1, 2])
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for j in range(20):
                    n = tree.append(r, [3, k, j], [-0.1, -0.2, -0.3], True, 0)
                    tree.finish(n, float(j))
            except BaseException as e:  # noqa: BLE001 - surfaced by the assert below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        taken: list[int] = []
        while any(th.is_alive() for th in threads):
            got = tree.take_batch(3, max_per_root=100, prune=False)
            taken += got or []
        for th in threads:
            th.join()
        assert not errors
    with TrajectoryTree.open(path) as again:
        assert len(again.leaf_ids()) == 80
        assert again.stats()["stored_tokens"] == 2 + 1 + 4 + 80
        assert again.unconsumed_count() == 80 - len(taken)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_cli_store_stats_and_show(tmp_path, capsys):
    path = tmp_path / "s.db"
    with TrajectoryTree.open(path) as tree:
        r = tree.add_root([1, 2], meta={"task": "x"})
        tree.finish(tree.append(r, [3, 4], [-0.1, -0.2], True, 7), 0.5)
    assert cli_main(["store", "stats", str(path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["leaves"] == 1 and stats["stored_tokens"] == 4
    assert cli_main(["store", "show", str(path), "--root", str(r), "--ids"]) == 0
    out = capsys.readouterr().out
    assert "1 2" in out and "v=7" in out and "reward=0.5" in out
    assert cli_main(["store", "show", str(path), "--root", "999"]) == 2
    assert cli_main(["store", "stats", str(tmp_path / "missing.db")]) == 2


def test_finish_is_synced_and_concurrent_syncs_share_fsyncs(tmp_path):
    """``finish`` returns after an fsync of the WAL; ``finish(durable=False)`` leaves it to
    ``sync()``, and threads that sync at the same time share fsyncs (a group sync)."""
    with TrajectoryTree.open(tmp_path / "g.db") as tree:
        r = tree.add_root([1, 2])
        tree.finish(tree.append(r, [3], [-0.1], True, 0), 1.0)
        assert tree._db.fsyncs == 1
        tree.finish(tree.append(r, [4], [-0.1], True, 0), 1.0, durable=False)
        assert tree._db.fsyncs == 1
        n = 16
        leaves = [
            tree.finish(tree.append(r, [5, k], [-0.1, -0.1], True, 0), 0.0, durable=False) for k in range(n)
        ]
        gate = threading.Barrier(n)

        def sync() -> None:
            gate.wait()
            tree.sync()

        threads = [threading.Thread(target=sync) for _ in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert 1 < tree._db.fsyncs < 1 + n  # at least one fsync, fewer than one per caller
        assert set(leaves) <= set(tree.leaf_ids())
    with TrajectoryTree() as memory:  # nothing to sync in memory
        memory.sync()
        assert memory._db.fsyncs == 0
