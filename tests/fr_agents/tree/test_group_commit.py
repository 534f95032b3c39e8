"""Group commit: writes inside ``TrajectoryTree.group()`` share one transaction, each a savepoint;
the rollout's tree writer commits a run of queued writes at once and resolves each caller after
the commit."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from fr_agents.rollout.writer import TreeWriter
from fr_agents.tree import DuplicateLeafError, TrajectoryTree


def _leaves_seen_by_another_connection(path: Path) -> int:
    with sqlite3.connect(path) as c:
        return int(c.execute("SELECT COUNT(*) FROM leaves").fetchone()[0])


def _episode(tree: TrajectoryTree, prompt: list[int], reply: list[int]) -> int:
    root = tree.add_root(prompt)
    node = tree.append(root, reply, [-0.5] * len(reply), True, 0)
    return tree.finish(node, 1.0, durable=False)


def test_writes_in_a_group_commit_together_and_a_failing_write_is_undone_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    tree = TrajectoryTree.open(path)
    done = _episode(tree, [1, 2], [3, 4])
    with tree.group():
        first = _episode(tree, [1, 2], [5, 6])
        with pytest.raises(DuplicateLeafError):
            tree.finish(done, 0.0)  # raises inside its own savepoint
        with pytest.raises(ValueError, match="unknown node"):
            tree.append(10_000, [7], [-1.0], True, 0)
        second = _episode(tree, [9], [8])
        assert _leaves_seen_by_another_connection(path) == 1, "nothing is visible before the group commits"
    assert _leaves_seen_by_another_connection(path) == 3
    assert sorted(tree.leaf_ids()) == sorted([done, first, second])
    assert tree.trajectory(first).token_ids == [1, 2, 5, 6] and tree.trajectory(done).reward == 1.0
    tree.close()


def test_a_group_that_raises_stores_none_of_its_writes(tmp_path: Path) -> None:
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    with pytest.raises(RuntimeError, match="stop"), tree.group():
        _episode(tree, [1], [2])
        raise RuntimeError("stop")
    assert tree.leaf_ids() == [] and tree.roots() == []
    _episode(tree, [1], [2])  # the thread is out of the group: plain transactions again
    assert len(tree.leaf_ids()) == 1
    tree.close()


def test_the_tree_writer_commits_queued_writes_in_one_run_and_each_caller_gets_its_own_outcome(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite"
    tree = TrajectoryTree.open(path)
    done = _episode(tree, [1], [2])
    writer = TreeWriter()
    gate, holding = threading.Event(), threading.Event()
    blocker = writer.submit(tree, lambda: holding.set() or gate.wait())
    assert holding.wait(30)  # the writer is held: the writes below queue up and form one run
    futures = [writer.submit(tree, lambda i=i: _episode(tree, [i + 10], [i + 20])) for i in range(5)]
    failing = writer.submit(tree, lambda: tree.finish(done, 0.0))
    seen_at_resolve: list[int] = []
    futures[0].add_done_callback(lambda _f: seen_at_resolve.append(_leaves_seen_by_another_connection(path)))
    gate.set()
    assert blocker.result(timeout=30) is True
    leaves = [f.result(timeout=30) for f in futures]
    with pytest.raises(DuplicateLeafError):
        failing.result(timeout=30)
    assert seen_at_resolve == [6], "a caller resumes only once its run is committed"
    assert sorted(tree.leaf_ids()) == sorted([done, *leaves])
    assert [tree.trajectory(x).token_ids for x in leaves] == [[i + 10, i + 20] for i in range(5)]
    tree.close()


def test_durable_writes_of_one_run_share_one_fsync_before_their_callers_resume(tmp_path: Path) -> None:
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    writer = TreeWriter()
    gate, holding = threading.Event(), threading.Event()
    fsyncs_at_resolve: list[int] = []
    blocker = writer.submit(tree, lambda: holding.set() or gate.wait())
    assert holding.wait(30)  # the writer is held: the writes below queue up and form one run
    durable = [
        writer.submit(tree, lambda i=i: _episode(tree, [i + 10], [i + 20]), durable=True) for i in range(5)
    ]
    plain = writer.submit(tree, lambda: _episode(tree, [99], [98]))
    durable[0].add_done_callback(lambda _f: fsyncs_at_resolve.append(tree._db.fsyncs))
    before = tree._db.fsyncs
    gate.set()
    assert blocker.result(timeout=30) is True
    [f.result(timeout=30) for f in [*durable, plain]]
    assert fsyncs_at_resolve == [before + 1], "a durable write resolves only after its run's one fsync"
    assert tree._db.fsyncs == before + 1
    # a run with no durable write is committed and not fsynced
    writer.submit(tree, lambda: _episode(tree, [7], [8])).result(timeout=30)
    assert tree._db.fsyncs == before + 1
    tree.close()


def test_a_durable_write_that_raises_is_still_followed_by_the_fsync(tmp_path: Path) -> None:
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    done = _episode(tree, [1], [2])
    writer = TreeWriter()
    before = tree._db.fsyncs
    with pytest.raises(DuplicateLeafError):  # the leaf it names is stored: the caller may count on it
        writer.submit(tree, lambda: tree.finish(done, 0.0), durable=True).result(timeout=30)
    assert tree._db.fsyncs == before + 1
    tree.close()


def test_a_write_whose_caller_cancelled_its_future_does_not_stop_the_writer(tmp_path: Path) -> None:
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    writer = TreeWriter()
    gate, holding = threading.Event(), threading.Event()
    blocker = writer.submit(tree, lambda: holding.set() or gate.wait())
    assert holding.wait(30)
    dropped = writer.submit(tree, lambda: _episode(tree, [1], [2]))
    kept = writer.submit(tree, lambda: _episode(tree, [3], [4]))
    assert dropped.cancel()
    gate.set()
    assert blocker.result(timeout=30) is True
    leaf = kept.result(timeout=30)
    assert tree.trajectory(leaf).token_ids == [3, 4]
    # the writer thread lives on: a later write is served
    assert writer.submit(tree, lambda: _episode(tree, [5], [6])).result(timeout=30) > 0
    tree.close()
