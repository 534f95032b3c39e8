"""The expert baseline for ALFWorld-v0: a sanity check and a source of SFT warm starts.

:class:`ExpertAgent` plays the game's stored planner walkthrough; once the episode has left it (the
agent was driven by someone else first), it asks Fast Downward for a plan from the current state.
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

from typing import Any


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
