"""Many episodes at once, and how a task becomes a reset.

Episodes are coroutines: :func:`run_episodes` runs ``n`` of them, at most ``concurrency`` at a
time, against one engine (which batches their requests into waves) and one tree; env calls run in
a thread pool, so a slow env does not stall the others. :func:`run_episodes_sync` does the same
from synchronous code. :func:`reset_args` says how a task record resets its env.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from fr_agents.policy.base import Engine
from fr_agents.rollout.episode import run_episode
from fr_agents.rollout.options import Actor, EpisodeResult, RolloutOptions


def reset_args(task: dict[str, Any], seed: int | None) -> tuple[int | None, dict[str, Any] | None]:
    """How to reset for ``task``: ``(seed, options["task"])``.

    A task whose metadata holds ``reset_seed`` (the ``env-reset`` source) is the env's own choice:
    ``reset(seed=reset_seed)`` with no task option. Any other task is handed over whole, with ``seed``.
    """
    meta = task.get("metadata") or {}
    if "reset_seed" in meta:
        return int(meta["reset_seed"]), None
    return seed, dict(task)


async def run_episodes(
    make_env: Callable[[], Any],
    engine: Engine | None,
    tokenizer: Any,
    tree: Any,
    n: int,
    options: RolloutOptions | None = None,
    *,
    concurrency: int = 64,
    seeds: Sequence[int] | None = None,
    tasks: Sequence[Any] | None = None,
    on_done: Callable[[EpisodeResult], None] | None = None,
    actor: Actor | None = None,
) -> list[EpisodeResult]:
    """Run ``n`` episodes, at most ``concurrency`` at once, against one engine; results in order.

    ``seeds[i]`` / ``tasks[i]`` (when given) seed and choose the task of episode ``i``;
    ``on_done`` is called as each episode finishes (progress bars); ``actor`` as in :func:`run_episode`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    for name, seq in (("seeds", seeds), ("tasks", tasks)):
        if seq is not None and len(seq) < n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} episodes")
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> EpisodeResult:
        async with gate:
            res = await run_episode(
                None,
                engine,
                tokenizer,
                tree,
                options,
                seed=seeds[i] if seeds is not None else None,
                task=tasks[i] if tasks is not None else None,
                make_env=make_env,
                actor=actor,
            )
            if on_done is not None:
                on_done(res)
            return res

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def run_episodes_sync(*args: Any, **kwargs: Any) -> list[EpisodeResult]:
    """:func:`run_episodes` from synchronous code (starts and closes its own event loop)."""
    return asyncio.run(run_episodes(*args, **kwargs))
