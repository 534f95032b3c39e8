"""``fr-agents rollout``'s work: N episodes into a durable trajectory store, and a summary.

    lines = collect(make_env, engine, tokenizer, "/tmp/tree.db", 16, RolloutOptions(branch_factor=2))
    print("\\n".join(lines))

Episode ``i`` is reset with seed ``seed + i``; with ``actor`` (e.g. the env's expert) the replies
are scripted and stored as non-policy tokens (demo spans), and the summary counts wins and demo
tokens instead of tokens per second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fr_agents.rollout import RolloutOptions, run_episodes
from fr_agents.tree import TrajectoryTree


def collect(
    make_env: Callable[[], Any],
    engine: Any,
    tokenizer: Any,
    out: str,
    episodes: int,
    opts: RolloutOptions,
    *,
    concurrency: int = 32,
    seed: int = 0,
    actor: Callable[[Any], str] | None = None,
) -> list[str]:
    """Run ``episodes`` episodes into the store at ``out`` (with a progress bar); the summary lines."""
    from rich.progress import Progress

    t0 = time.monotonic()
    with TrajectoryTree.open(out) as tree, Progress(transient=True) as bar:
        task = bar.add_task("episodes", total=episodes)
        results = asyncio.run(
            run_episodes(
                make_env,
                engine,
                tokenizer,
                tree,
                episodes,
                opts,
                concurrency=concurrency,
                seeds=[seed + i for i in range(episodes)],
                on_done=lambda r: bar.advance(task),
                actor=actor,
            )
        )
        stats = tree.stats()
    elapsed = time.monotonic() - t0
    leaves = [leaf for r in results for leaf in r.leaves]
    tokens = sum(leaf.policy_tokens for leaf in leaves)
    graded = [leaf for leaf in leaves if leaf.status != "aborted"]  # aborted: grading could not happen
    lines = [
        f"episodes     {len(results)}",
        f"leaves       {len(leaves)}",
        f"mean reward  {sum(leaf.reward for leaf in graded) / len(graded):.4f}"
        if graded
        else "mean reward  n/a",
    ]
    if len(graded) < len(leaves):
        reasons = sorted({str(leaf.info.get("aborted_by")) for leaf in leaves if leaf.status == "aborted"})
        lines.append(
            f"aborted      {len(leaves) - len(graded)} (not graded: {', '.join(reasons)}; not in the mean)"
        )
    if actor is not None:
        demo = sum(e - s for leaf in leaves for s, e in leaf.info.get("demo_spans", []))
        won = sum(bool(leaf.info.get("won")) for leaf in leaves)
        lines.append(
            f"expert       won {won}/{len(leaves)}, {demo} demo tokens (policy_mask=False) in {elapsed:.1f}s"
        )
    else:
        lines.append(f"tokens/s     {tokens / elapsed:.1f}  ({tokens} policy tokens in {elapsed:.1f}s)")
    lines.append(
        f"store        {out}  (leaves {stats['leaves']}, sharing_ratio {stats['sharing_ratio']:.2f})"
    )
    return lines
