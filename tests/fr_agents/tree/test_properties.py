"""Property tests on random branching workloads, checked against a plain-Python reference model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fr_agents.tree import DuplicateLeafError, TrajectoryTree

LOGPROBS = (-0.25, -1.0)

# One token sample: (id, log-prob, policy?, version). Tiny alphabets make sharing and splits common.
token = st.tuples(st.integers(0, 2), st.sampled_from(LOGPROBS), st.booleans(), st.integers(0, 1))
op = st.one_of(
    st.tuples(st.just("root"), st.lists(st.integers(0, 1), min_size=1, max_size=2)),
    st.tuples(
        st.just("append"), st.integers(0, 10**6), st.lists(token, min_size=1, max_size=4), st.integers(0, 1)
    ),
    st.tuples(st.just("finish"), st.integers(0, 10**6), st.integers(-1, 2)),
    st.tuples(st.just("take"), st.integers(1, 4), st.integers(1, 3)),
)


def _identity(tok: int, lp: float, pol: bool, ver: int) -> tuple[int, float, bool, int]:
    """How the tree sees one token: env tokens carry log-prob 0 and version -1."""
    return (tok, lp if pol else 0.0, pol, ver if pol else -1)


def _run(tree: TrajectoryTree, ops: list[tuple]) -> None:
    path_of: dict[int, tuple] = {}  # node id -> expected tuple of token identities (root first)
    # the reverse: equal paths under one root must be one node (a root is one prompt: a prompt [1, 1]
    # and a prompt [1] followed by a token 1 are two trajectories, told apart by their prompt length)
    id_of: dict[tuple, int] = {}
    prompt_len: dict[int, int] = {}
    root_of: dict[int, int] = {}
    roots: list[int] = []
    finished: list[int] = []
    taken: set[int] = set()
    for o in ops:
        if o[0] == "root" or not roots:
            prompt = o[1] if o[0] == "root" else [0]
            r = tree.add_root(prompt)
            expect = tuple(_identity(t, 0.0, False, -1) for t in prompt)
            assert path_of.setdefault(r, expect) == expect
            if r not in roots:
                roots.append(r)
            prompt_len[r], root_of[r] = len(prompt), r
        elif o[0] == "append":
            nodes = sorted(path_of)
            parent = nodes[o[1] % len(nodes)]
            toks = o[2]
            # a segment has one version: the op's last field picks it for every policy token
            ver = o[3]
            node = tree.append(parent, [t[0] for t in toks], [t[1] for t in toks], [t[2] for t in toks], ver)
            expect = path_of[parent] + tuple(_identity(t[0], t[1], t[2], ver) for t in toks)
            assert path_of.setdefault(node, expect) == expect, "one node id, two different paths"
            root_of[node] = root_of[parent]
            assert id_of.setdefault((root_of[node], expect), node) == node, "one path, two node ids"
        elif o[0] == "finish":
            cands = sorted(n for n in path_of if n not in roots)
            if not cands:
                continue
            node = cands[o[1] % len(cands)]
            if node in finished:
                with pytest.raises(DuplicateLeafError):
                    tree.finish(node, float(o[2]))
            else:
                assert tree.finish(node, float(o[2])) == node
                finished.append(node)
        else:
            got = tree.take_batch(o[1], max_per_root=o[2], allow_partial=True, prune=False)
            got = got or []
            assert len(got) <= o[1] and len(set(got)) == len(got)
            assert not taken & set(got), "a leaf was returned twice"
            per_root = [root_of[x] for x in got]
            assert all(per_root.count(r) <= o[2] for r in per_root)
            assert set(got) <= set(finished)
            taken |= set(got)

    # every finished leaf's trajectory is exactly what was appended along its path
    assert tree.leaf_ids() == finished
    for leaf in finished:
        t = tree.trajectory(leaf)
        got = tuple(
            _identity(tok, float(np.float32(lp)), pol, ver)
            for tok, lp, pol, ver in zip(t.token_ids, t.logprobs, t.policy_mask, t.versions, strict=True)
        )
        assert got == path_of[leaf]
        assert t.prompt_len == prompt_len[t.root_id] and t.root_id == root_of[leaf]
    # stats invariants: stored tokens = distinct prompts + distinct response-token prefixes per root
    s = tree.stats()
    distinct = {
        (root_of[n], p[:k]) for n, p in path_of.items() for k in range(prompt_len[root_of[n]] + 1, len(p) + 1)
    }
    assert s["stored_tokens"] == sum(prompt_len[r] for r in roots) + len(distinct)
    assert s["logical_tokens"] == sum(len(path_of[x]) for x in finished)
    assert s["leaves"] == len(finished) and s["roots"] == len(roots)
    assert len(roots) <= s["nodes"] <= s["stored_tokens"]
    assert s["consumed"] == len(taken) and s["available"] == len(finished) - len(taken)
    assert tree.unconsumed_count() == len(finished) - len(taken)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=60))
@example(
    [
        ("finish", 0, 0),
        ("root", [1, 1]),
        ("append", 0, [(0, -0.25, False, 0)], 0),
        ("root", [1]),
        ("append", 1, [(2, -0.25, False, 0), (0, -0.25, False, 0)], 0),
        ("append", 3, [(1, -0.25, False, 0), (2, -0.25, False, 0)], 0),
    ]
)  # a prompt [1, 1] beside a prompt [1] followed by a token 1
def test_random_workloads_in_memory(ops):
    tree = TrajectoryTree()
    try:
        _run(tree, ops)
    finally:
        tree.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(op, min_size=1, max_size=40))
def test_random_workloads_durable(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("prop") / "s.db"
    with TrajectoryTree.open(path) as tree:
        _run(tree, ops)
