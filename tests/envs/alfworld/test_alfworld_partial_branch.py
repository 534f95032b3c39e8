"""ALFWorld-v0: a branch the rollout cuts carries the env's goal-condition progress as its reward."""

from __future__ import annotations

from typing import Any

import gymnasium
import pytest
from transformers import AutoTokenizer

import envs  # noqa: F401  (registers the ids)
from fr_agents.models import create_tiny
from tests.envs.branch_check import run_truncated_branches


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(
        create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    )


def test_cut_alfworld_branches_carry_their_partial_score(games_root: str, tok: Any) -> None:
    env = gymnasium.make("fr_agents/ALFWorld-v0", games_dir=games_root, split="valid_unseen", max_turns=10)
    leaves = run_truncated_branches(
        env, tok, "<action>look</action>", ["<action>inventory</action>", "<action>look</action>"], seed=1
    )
    assert len({x.leaf_id for x in leaves}) == 2


def test_a_cut_alfworld_episode_records_the_reply_after_which_its_score_first_reached_its_best(
    games_root: str, tok: Any
) -> None:
    """The leaf's ``info["progress_turn"]`` is the number of replies made when the env's partial
    score first reached its best, as a replay of the commands on a fresh engine shows: the
    walkthrough's first take, not the same take again after putting the object back (no new
    progress), nor the looks until the cut. ``rollout.reward: progress`` pays the replies up to it."""
    import asyncio
    import json
    from pathlib import Path

    from envs.alfworld.env import ALFWorldEnv
    from envs.alfworld.generate import find_games
    from fr_agents.rollout import RolloutOptions, run_episode
    from fr_agents.tree import TrajectoryTree

    game = next(
        g
        for g in find_games(games_root, "valid_seen")
        if json.loads((Path(g).parent / "traj_data.json").read_text())["task_type"] == "pick_and_place_simple"
    )
    probe = ALFWorldEnv(game_files=[game])
    probe.reset(seed=0)
    take = next(i for i, c in enumerate(probe.walkthrough) if c.startswith("take "))
    obj, recep = probe.walkthrough[take][len("take ") :].split(" from ")
    put_back = f"move {obj} to {recep}"
    commands = [*probe.walkthrough[: take + 1], put_back, probe.walkthrough[take], "look", "look"]
    scores = [probe.step(c)[4]["partial_score"] for c in commands]
    probe.close()
    rises = [k + 1 for k in range(len(scores)) if scores[k] > (scores[k - 1] if k else 0.0)]
    # the take pays, putting it back takes it away, the second take pays the same again, the looks
    # nothing: the score first reached its best with the first take
    assert rises == [take + 1, take + 3] and scores[take] == scores[-1] > 0, scores

    replies = iter(f"<action>{c}</action>" for c in commands)
    tree = TrajectoryTree()
    opts = RolloutOptions(max_turns=len(commands), max_context=4096)
    env = ALFWorldEnv(game_files=[game])
    result = asyncio.run(run_episode(env, None, tok, tree, opts, seed=0, actor=lambda _env: next(replies)))
    (leaf,) = result.leaves
    assert leaf.status == "truncated" and leaf.partial_score == scores[-1]
    assert leaf.info["progress_turn"] == take + 1
    assert tree.trajectory(leaf.leaf_id).info["progress_turn"] == take + 1
