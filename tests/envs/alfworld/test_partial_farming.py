"""ALFWorld-v0's partial score cannot be farmed on real games: repeating actions earns nothing twice.

The synthetic-state cases (conditions true at reset, pre-placed objects, a lamp already on) are in
``tests/envs/test_reward_hacks_answers.py``; these play generated games through the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.alfworld.env import ALFWorldEnv
from envs.alfworld.generate import find_games

pytestmark = pytest.mark.alfworld


def _env_for(root: str, task_type: str) -> ALFWorldEnv:
    game = next(
        g
        for g in find_games(root, "valid_seen")
        if json.loads((Path(g).parent / "traj_data.json").read_text())["task_type"] == task_type
    )
    env = ALFWorldEnv(game_files=[game])
    env.reset(seed=0)
    return env


def _take_step(walkthrough: list[str]) -> tuple[str, str, str]:
    """(go-to command, take command, the put-back command) of the walkthrough's first take."""
    i = next(i for i, c in enumerate(walkthrough) if c.startswith("take "))
    obj, recep = walkthrough[i][len("take ") :].split(" from ")
    return walkthrough[i - 1], walkthrough[i], f"move {obj} to {recep}"


def test_hack_alfworld_pick_up_and_put_back_repeatedly(games_root: str) -> None:
    env = _env_for(games_root, "pick_and_place_simple")
    go, take, put_back = _take_step(env.walkthrough)
    assert env.step(go)[4]["partial_score"] == 0.0
    for _ in range(4):
        _, reward, _, _, info = env.step(take)
        assert info["partial_score"] == 0.5 and reward == 0.0  # holding the object: real, once
        _, reward, _, _, info = env.step(put_back)
        assert not info["invalid_action"], info
        assert info["partial_score"] == 0.0 and reward == 0.0  # back where it was: nothing
    env.close()


def test_hack_alfworld_using_the_lamp_again_and_again_without_the_object(games_root: str) -> None:
    env = _env_for(games_root, "look_at_obj_in_light")
    use = next(c for c in env.walkthrough if c.startswith("use "))
    go_to_lamp = env.walkthrough[env.walkthrough.index(use) - 1]
    env.step(go_to_lamp)
    scores = []
    for _ in range(4):
        _, reward, terminated, _, info = env.step(use)
        assert reward == 0.0 and not terminated
        scores.append(info["partial_score"])
    assert max(scores) <= 1 / 3 + 1e-9, scores  # the lamp's own condition at most, never summed
    env.close()
