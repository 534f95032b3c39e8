"""ALFWorld-v0's searching expert (expert="search"): it looks for the task's object where a person
in the room would, wins every task type, and follows its plan without planning again each turn."""

from __future__ import annotations

import re

import pytest

from envs.alfworld.engine import ENGINE_CLOCK
from envs.alfworld.env import ALFWorldEnv
from envs.alfworld.expert import ExpertAgent, room_receptacles
from envs.alfworld.sampling import TASK_TYPES, target_start_excluded

pytestmark = pytest.mark.alfworld


def test_room_receptacles_in_the_rooms_order() -> None:
    obs = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
        "you see a bed 1, a desk 1, a drawer 2, an armchair 1, and a shelf 1.\n\nYour task is to: x."
    )
    assert room_receptacles(obs) == ["bed 1", "desk 1", "drawer 2", "armchair 1", "shelf 1"]
    assert room_receptacles("no room here") == []


def play(env: ALFWorldEnv, game: int) -> tuple[list[str], dict]:
    _, info = env.reset(options={"game": game})
    agent, acts = ExpertAgent(), []
    for _ in range(env.max_turns):
        acts.append(agent.act(env))
        _, _, terminated, truncated, info = env.step(acts[-1])
        if terminated or truncated:
            break
    return [re.sub(r"</?action>", "", a) for a in acts], info


@pytest.mark.parametrize("split", ["valid_seen", "valid_unseen"])
def test_the_searching_expert_wins_every_task_type(games_root: str, split: str) -> None:
    import alfworld.gen.constants as c

    env = ALFWorldEnv(split=split, games_dir=games_root, expert="search", max_turns=60, list_admissible=False)
    won = set()
    for i in range(len(env.games)):
        acts, info = play(env, i)
        assert info["won"], (info["task_type"], acts)
        won.add(info["task_type"])
        # until the object is in view it only goes to (and opens) places that may hold its type
        params = env._traj["pddl_params"]
        excluded = target_start_excluded(params["parent_target"])
        for a in acts:
            if not a.startswith("go to "):
                break
            rtype = c.OBJECTS_LOWER_TO_UPPER[a.removeprefix("go to ").rsplit(" ", 1)[0]]
            assert rtype not in excluded and params["object_target"] in c.VAL_RECEPTACLE_OBJECTS[rtype], acts
    env.close()
    assert won == set(TASK_TYPES)


def test_the_expert_plans_once_and_follows_its_plan(games_root: str) -> None:
    """Off its walkthrough (a detour first), the planner expert plans once and follows that plan."""
    env = ALFWorldEnv(split="valid_seen", games_dir=games_root, max_turns=60)
    _, info = env.reset(options={"game": 0})
    detour = next(c for c in info["admissible_commands"] if c.startswith("go to") and c != env.walkthrough[0])
    env.step(detour)
    ENGINE_CLOCK.clear()
    for _ in range(env.max_turns - 1):
        _, _, terminated, truncated, info = env.step(ExpertAgent().act(env))
        if terminated or truncated:
            break
    assert info["won"] and ENGINE_CLOCK.calls.get("plan", 0) == 1, ENGINE_CLOCK.calls
    env.close()


def test_after_the_search_the_expert_follows_the_walkthrough_without_planning(games_root: str) -> None:
    """Once the object is in view the searching expert takes it and goes on with the stored
    walkthrough (that instance's name in it): no Fast Downward plan, which from an arbitrary state
    can take minutes. Only a lamp task whose walkthrough used the lamp before the take plans the
    last steps."""
    env = ALFWorldEnv(split="valid_unseen", games_dir=games_root, expert="search", max_turns=60)
    for i in range(len(env.games)):
        ENGINE_CLOCK.clear()
        acts, info = play(env, i)
        assert info["won"], acts
        if info["task_type"] != "look_at_obj_in_light":
            assert ENGINE_CLOCK.calls.get("plan", 0) == 0, (info["task_type"], acts)
    env.close()


def test_an_unknown_expert_is_refused() -> None:
    with pytest.raises(ValueError, match="expert must be 'planner' or 'search'"):
        ALFWorldEnv(expert="oracle")
