"""Calls into an env: one thread pool for every env call of every episode, and how messages name an env.

Env methods (``reset``, ``step``, ``fork``, ``close``, ``partial_score``) may block (a sandbox, a
grader in worker processes), so the episodes' event loop runs them on :data:`ENV_POOL`'s threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fr_agents import hops

ENV_POOL = hops.HopPool(max_workers=64, name="fr-env")


async def in_env_thread(fn: Callable[..., Any], *a: Any) -> Any:
    """``fn(*a)`` on an env thread, awaited."""
    return await ENV_POOL.call(fn, *a)


def env_name(env: Any) -> str:
    """The env's registered id (its base env's spec), else its class name: how messages name it."""
    base = getattr(env, "unwrapped", env)
    # the base env's own spec: a wrapper's ``spec`` property deep-copies it on every read
    spec = getattr(base, "spec", None) or getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(base).__name__
