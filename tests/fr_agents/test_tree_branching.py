"""Branching episodes as training runs them: per-branch seed streams (a branch's tokens do not depend
on how its siblings interleave) and the tree token budget (split equally at each fork)."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
import rollout_envs  # noqa: F401  (registers the test envs)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.policy.hf import HFEngine
from fr_agents.policy.seeded import SeededEngine
from fr_agents.rollout import RolloutOptions, run_episode
from fr_agents.tree import TrajectoryTree

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def _episode(engine, tok, opts, seed=3):
    tree = TrajectoryTree()
    env = gymnasium.make("fr_agents_test/ForkCount-v0")
    view = SeededEngine(engine, lambda n: 1000 + n)
    res = asyncio.run(run_episode(env, view, tok, tree, opts, seed=seed))
    return tree, res


def test_branches_get_their_own_seed_streams_and_reproduce(tiny) -> None:
    model, tok = tiny
    opts = RolloutOptions(max_new_tokens=6, max_context=300, max_turns=3, branch_factor=3, branch_at=(1,))
    engine = HFEngine(model, tok, seed=0)
    runs = [_episode(engine, tok, opts) for _ in range(2)]
    engine.close_sync()
    tokens = [[t.token_ids for t in tree.trajectories([x.leaf_id for x in res.leaves])] for tree, res in runs]
    assert tokens[0] == tokens[1]  # same seeds, same tree
    assert len({tuple(t) for t in tokens[0]}) == 3  # three different continuations, not one seed thrice


def test_tree_budget_is_split_among_siblings_and_cut_branches_end_truncated(tiny) -> None:
    model, tok = tiny
    budget = 10
    opts = RolloutOptions(
        max_new_tokens=6,
        max_context=300,
        max_turns=4,
        branch_factor=2,
        branch_at=(1,),
        tree_budget_tokens=budget,
        stop_token_ids=(10**6,),
    )  # never stop early: 6 tokens a turn
    engine = HFEngine(model, tok, seed=0)
    tree, res = _episode(engine, tok, opts)
    engine.close_sync()
    assert len(res.leaves) == 2
    a, b = tree.trajectories([x.leaf_id for x in res.leaves])
    shared = len(set(a.path) & set(b.path))
    first = sum(a.policy_mask[: a.offsets[shared] if shared < len(a.offsets) else len(a.token_ids)])
    assert 1 <= first <= 6
    # turn 0 takes `first` of 10; each branch gets (10 - first) / 2 tokens for turn 1, then is cut
    for leaf in res.leaves:
        assert leaf.policy_tokens - first == int((budget - first) / 2)
        assert leaf.status == "truncated" and leaf.info["truncated_by"] == "tree_budget"
    assert first + sum(leaf.policy_tokens - first for leaf in res.leaves) <= budget
    with pytest.raises(ValueError, match="tree_budget_tokens"):
        RolloutOptions(tree_budget_tokens=-1)


def test_entropy_policy_forks_only_after_uncertain_actions(tiny) -> None:
    model, tok = tiny
    engine = HFEngine(model, tok, seed=0)
    common = {
        "max_new_tokens": 6,
        "max_context": 300,
        "max_turns": 3,
        "branch_factor": 2,
        "branch_at": (1, 2),
    }

    def leaves(threshold: float):
        return _episode(
            engine, tok, RolloutOptions(**common, branch_policy="entropy", branch_entropy=threshold)
        )

    tree, always = leaves(0.0)
    _, never = leaves(1e9)
    # the first action's mean surprisal decides the fork at turn 1
    t = tree.trajectory(always.leaves[0].leaf_id)
    first = [i for i, m in enumerate(t.policy_mask) if m]
    first = first[: next((k for k in range(1, len(first)) if first[k] != first[k - 1] + 1), len(first))]
    s1 = -sum(t.logprobs[i] for i in first) / len(first)
    _, above = leaves(s1 + 1e-4)
    _, below = leaves(s1 - 1e-4)
    engine.close_sync()
    assert len(always.leaves) == 4 and len(never.leaves) == 1
    assert len(above.leaves) <= 2  # no fork at turn 1 (turn 2 may still fork)
    assert len(below.leaves) >= 2  # forks at turn 1 (and each branch may fork again at turn 2)
    with pytest.raises(ValueError, match="branch_policy"):
        RolloutOptions(branch_policy="widest")  # type: ignore[arg-type]


def _stored_policy_tokens(tree, leaf_ids) -> int:
    seen, total = set(), 0
    for traj in tree.trajectories(sorted(set(leaf_ids))):
        ends = [*traj.offsets[1:], len(traj.token_ids)]
        for node, a, b in zip(traj.path, traj.offsets, ends, strict=True):
            if node not in seen:
                seen.add(node)
                total += sum(traj.policy_mask[a:b])
    return total


@pytest.mark.parametrize("temperature", [1.0, 1e-4])
def test_an_episode_counts_the_tokens_the_engine_sampled_identical_siblings_included(
    tiny, temperature
) -> None:
    """``sampled_tokens`` (summed over an episode's leaves) is the engine's own count: a fork's shared
    part once, every forked continuation, also those identical to a sibling, which the tree stores
    once (near-greedy sampling makes all three forks identical)."""
    model, tok = tiny
    opts = RolloutOptions(
        max_new_tokens=6,
        max_context=300,
        max_turns=3,
        branch_factor=3,
        branch_at=(1,),
        temperature=temperature,
    )
    engine = HFEngine(model, tok, seed=0)
    before = engine.stats["tokens"]
    tree, res = _episode(engine, tok, opts)
    sampled = engine.stats["tokens"] - before
    engine.close_sync()
    leaves = [x.leaf_id for x in res.leaves]
    assert len(leaves) == 3 and res.sampled_tokens == sampled
    stored = _stored_policy_tokens(tree, leaves)
    if temperature < 1:
        assert len(set(leaves)) == 1, "identical continuations: one stored leaf"
        first, second, third = (x.sampled_tokens for x in res.leaves)
        assert first > second == third > 0, "the first branch also holds the shared part"
        assert stored == first < sampled
    else:
        assert len(set(leaves)) == 3 and stored == sampled


def test_a_fork_copies_its_branchs_state_and_shares_no_container() -> None:
    """``_Branch.fork``: the continuation starts from the same state with its own env, its own copy
    of every list, dict and set (growing one leaves the other as it was) and nothing sampled yet."""
    from dataclasses import fields

    from fr_agents.rollout.branching import _Branch

    parent = _Branch(
        "env-a",
        [{"role": "user", "content": "hi"}],
        [1, 2, 3],
        "hi",
        node=7,
        turn=2,
        rewards=[0.5],
        actions=["a"],
        observations=["o0", "o1"],
        info={"won": False},
        policy_tokens=9,
        sampled=4,
        branched={0},
        turn_starts=[3],
        demo_spans=[(0, 2)],
        engine="engine-view",
        budget=12.0,
        surprisal=0.3,
    )
    child = parent.fork("env-b")
    assert child.env == "env-b" and parent.env == "env-a"
    assert child.sampled == 0 and parent.sampled == 4
    for f in fields(_Branch):
        if f.name in ("env", "sampled"):
            continue
        mine, theirs = getattr(parent, f.name), getattr(child, f.name)
        assert theirs == mine, f.name
        if isinstance(mine, list | dict | set):
            assert theirs is not mine, f"{f.name} is shared with the parent"
    child.held_ids.append(4)
    child.rewards.append(1.0)
    child.info["won"] = True
    child.branched.add(2)
    child.demo_spans.append((3, 4))
    assert parent.held_ids == [1, 2, 3] and parent.rewards == [0.5] and parent.info == {"won": False}
    assert parent.branched == {0} and parent.demo_spans == [(0, 2)]
