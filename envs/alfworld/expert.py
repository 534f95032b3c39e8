"""The expert baseline for ALFWorld-v0: a sanity check and a source of SFT warm starts.

:class:`ExpertAgent` plays the game's stored planner walkthrough; once the episode has left it (the
agent was driven by someone else first), it asks Fast Downward for a plan from the current state.
With ``ALFWorldEnv(expert="search")`` the expert first searches for the task's object as a person
in the room would (:func:`search_step`), then takes it and follows the walkthrough (:func:`after_search`).
It needs the env itself (not only the observation), so it works with any env that exposes
``expert_action()`` on ``env.unwrapped``::

    agent = ExpertAgent()
    obs, info = env.reset(seed=0)
    while True:
        obs, r, term, trunc, info = env.step(agent.act(env))
        if term or trunc:
            break
"""

from __future__ import annotations

import re
from typing import Any

_ROOM = re.compile(r"Looking quickly around you, you see (.*?)\.\s*$", re.MULTILINE)
_CLOSED = re.compile(r"\bThe (\w+ \d+) is closed\.")  # "You arrive at cabinet 2. The cabinet 2 is closed."


def room_receptacles(first_observation: str) -> list[str]:
    """The receptacles the first observation lists, in its order (``["bed 1", "desk 1", ...]``)."""
    m = _ROOM.search(first_observation)
    if not m:
        return []
    items = re.split(r",\s*(?:and\s+)?|\s+and\s+", m.group(1))
    return [re.sub(r"^an? ", "", item.strip()) for item in items if item.strip()]


def search_step(
    traj: dict, first_observation: str, transcript: list[tuple[str, str]], actions: list[str]
) -> str | None:
    """The searching expert's next command while the task's object has not been seen, else None.

    It knows what a person in the room knows: the receptacles in view (the first observation) and
    ALFRED's rules of where an object of a type may start (a receptacle type that can hold it, not
    the goal's, not a fridge, microwave or basin: :func:`envs.alfworld.sampling.target_start_excluded`),
    never where the object is. It goes to each such receptacle in the order the room lists them,
    opening a closed one, until an observation names an object of the task's type; then
    :func:`after_search` finishes the task (:meth:`ALFWorldEnv.expert_action`). Demos of it show a
    search, which a policy that cannot see the game's state can imitate; the planner's own
    walkthrough goes straight to the object."""
    import alfworld.gen.constants as c

    from envs.alfworld.sampling import target_start_excluded

    params = traj["pddl_params"]
    target = params["object_target"].lower()
    seen = re.compile(rf"\b{re.escape(target)} \d+\b")
    if any(seen.search(text) for who, text in transcript if who == "game"):
        return None
    excluded = target_start_excluded(params.get("parent_target", ""))
    upper = c.OBJECTS_LOWER_TO_UPPER

    def may_hold(receptacle: str) -> bool:
        rtype = upper.get(receptacle.rsplit(" ", 1)[0], "")
        return rtype not in excluded and params["object_target"] in c.VAL_RECEPTACLE_OBJECTS.get(rtype, ())

    last = transcript[-1][1] if transcript else ""
    closed = _CLOSED.search(last)
    if actions and actions[-1].startswith("go to ") and closed and f"open {closed.group(1)}" not in actions:
        return f"open {closed.group(1)}"
    visited = {a.removeprefix("go to ") for a in actions if a.startswith("go to ")}
    for receptacle in room_receptacles(first_observation):
        if receptacle not in visited and may_hold(receptacle):
            return f"go to {receptacle}"
    return None


class ExpertAgent:
    """Replies with the expert's next command for ``env`` in the env's action format
    (:func:`fr_agents.rollout.expert_actor`: ``<action>CMD</action>`` on ALFWorld)."""

    name = "expert"

    def act(self, env: Any, observation: str | None = None) -> str:  # noqa: ARG002 - same shape as other agents
        from fr_agents.rollout import expert_actor

        return expert_actor(env)


def walkthrough(env: Any) -> list[str]:
    """The current game's stored walkthrough (after ``reset``)."""
    return getattr(env, "unwrapped", env).walkthrough


def has_expert(env: Any) -> bool:
    """Whether ``env`` offers an expert (``--agent expert`` checks this)."""
    return hasattr(getattr(env, "unwrapped", env), "expert_action")


def after_search(
    target: str, walkthrough: list[str], last_observation: str, actions: list[str]
) -> list[str] | None:
    """The rest of the task once the search has found an object of type ``target`` in view: take
    the instance the last observation names, then the stored walkthrough after its own take, with
    that instance's name in place of the walkthrough's (the tool and goal receptacles stay the
    walkthrough's). On ``pick_two_obj_and_place``, when the instance found is the walkthrough's
    second one, the first is fetched where the walkthrough takes it. Opening what the search
    opened and going where the agent stands are left out. None when there is no take to follow
    (the planner takes over). Never plans: a plan from an arbitrary state can take Fast Downward
    minutes."""
    name = re.compile(rf"\b{re.escape(target)} \d+\b")
    found = name.search(last_observation)
    takes = [i for i, c in enumerate(walkthrough) if c.startswith("take ") and name.search(c)]
    here = next((a.removeprefix("go to ") for a in reversed(actions) if a.startswith("go to ")), None)
    if found is None or not takes or here is None:
        return None
    ours = found.group(0)

    def rename(cmds: list[str], old: str, new: str) -> list[str]:
        return [re.sub(rf"\b{re.escape(old)}\b", new, c) for c in cmds]

    first = name.search(walkthrough[takes[0]]).group(0)
    rest = [f"take {ours} from {here}"]
    second = name.search(walkthrough[takes[1]]).group(0) if len(takes) > 1 else None
    if second is not None and ours == second:  # place it, then fetch the walkthrough's first instance
        j, k = takes[:2]
        placed = next((i for i in range(j + 1, k) if walkthrough[i].startswith("move ")), None)
        if placed is None:
            return None
        rest += rename(walkthrough[j + 1 : placed + 1], first, ours)  # to the goal, put it there
        rest += walkthrough[: j + 1]  # to where the walkthrough takes the first one, take it
        rest += rename(walkthrough[k + 1 :], second, first)  # to the goal again, put it there
    else:
        rest += rename(walkthrough[takes[0] + 1 :], first, ours)
    opened = {a.removeprefix("open ") for a in actions if a.startswith("open ")}
    out, at = [], here
    for c in rest:
        if c.startswith("open ") and c.removeprefix("open ") in opened:
            continue
        if c.startswith("go to "):
            if c.removeprefix("go to ") == at:
                continue
            at = c.removeprefix("go to ")
        out.append(c)
    return out
