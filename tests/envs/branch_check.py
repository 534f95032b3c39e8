"""A truncated branch is scored by its env's partial progress: the shared check of every env.

:func:`run_truncated_branches` drives an env with scripted replies through the real episode
runner, forking at turn 1 into two branches that the rollout's turn budget then cuts, and checks
each leaf as the trainer will read it: status ``truncated``, a partial score in [0, 1] taken from the
env's own ``info``, and ``rollout.reward: partial`` giving exactly that score to the learner.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from fr_agents.rollout import LeafResult, RolloutOptions, run_episode
from fr_agents.tree import TrajectoryTree


def run_truncated_branches(
    env: Any,
    tok: Any,
    first: str,
    branches: Sequence[str],
    *,
    task: Any = None,
    seed: int = 0,
    max_context: int = 4096,
) -> list[LeafResult]:
    """Reply ``first`` at turn 0, fork into ``len(branches)`` at turn 1 (branch ``i`` replies
    ``branches[i]`` in whatever order the branches ask), cut at 2 turns; returns the leaves."""
    order = itertools.count()
    later = list(branches)

    def actor(_env: Any) -> str:
        n = next(order)
        return first if n == 0 else later[n - 1]

    tree = TrajectoryTree()
    opts = RolloutOptions(max_turns=2, branch_factor=len(branches), branch_at=(1,), max_context=max_context)
    result = asyncio.run(run_episode(env, None, tok, tree, opts, seed=seed, task=task, actor=actor))
    assert len(result.leaves) == len(branches)
    for leaf in result.leaves:
        traj = tree.trajectory(leaf.leaf_id)
        assert leaf.status == "truncated" and leaf.info["truncated_by"] == "max_turns", leaf
        assert leaf.partial_score is not None and 0.0 <= leaf.partial_score <= 1.0
        assert traj.learner_reward("partial") == leaf.partial_score
        assert traj.learner_reward("env") == leaf.reward
    return result.leaves
