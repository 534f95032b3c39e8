"""Scripted actors: replies that come from the env's own expert instead of the policy.

``--agent expert`` (and the warm start's demos) run episodes with ``actor=expert_actor``: each
reply is what the env's expert would do, encoded text rather than a sample. The episode stores
those tokens as non-policy tokens (no behaviour log-prob, version -1), and each leaf's ``info``
names the ``agent`` and lists its ``demo_spans``: the ``[start, end)`` token offsets (on the
root-to-leaf path) of every scripted reply, end-of-turn token included, i.e. where a supervised
loss belongs. So the store doubles as a set of demos.

An env has an expert when its ``env.unwrapped`` has ``expert_action()`` (and, for replies in the
env's own action format, ``expert_reply()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fr_agents.rollout.env_thread import env_name


class NoExpertError(ValueError):
    """``--agent expert`` on an env without ``expert_action()``."""


def expert_actor(env: Any) -> str:
    """The env's own expert's next reply (the actor of ``--agent expert``).

    ``env.unwrapped.expert_reply()`` when the env has it (the reply in the env's action format,
    e.g. ALFWorld's ``<action>cmd</action>``), else ``env.unwrapped.expert_action()`` verbatim.
    """
    inner = getattr(env, "unwrapped", env)
    if callable(getattr(inner, "expert_reply", None)):
        return str(inner.expert_reply())
    if callable(getattr(inner, "expert_action", None)):
        return str(inner.expert_action())
    raise NoExpertError(
        f"env {env_name(env)} has no expert: --agent expert needs env.unwrapped.expert_action() "
        "(fr_agents/ALFWorld-v0 has one)"
    )


def has_expert(env: Any) -> bool:
    """Whether :func:`expert_actor` can drive ``env``."""
    return callable(getattr(getattr(env, "unwrapped", env), "expert_action", None))


def require_expert(make_env: Callable[[], Any], env_id: str) -> None:
    """Raise :class:`~fr_agents.config.ConfigError` naming ``env_id`` when its env has no expert."""
    from fr_agents.config import ConfigError

    env = make_env()
    try:
        if not has_expert(env):
            raise ConfigError(
                f"--agent expert: env {env_id} has no expert (its env.unwrapped has no expert_action(); "
                "fr_agents/ALFWorld-v0 has one)"
            )
    finally:
        env.close()
