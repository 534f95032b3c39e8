"""Rollout throughput: 32 concurrent episodes through one HFEngine vs the same episodes one at a time.

Prints policy tokens/s of both runs and their ratio (goal >= 4x), measured in one process, same
model (tiny micro, fp32, CPU), same env, same seeds. Usage: ``python benchmarks/rollout.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

import gymnasium
import torch

from fr_agents.models import create_tiny, load_policy
from fr_agents.policy.hf import HFEngine
from fr_agents.rollout import RolloutOptions, run_episode, run_episodes
from fr_agents.spaces import AnyText
from fr_agents.tree import TrajectoryTree


class EchoEnv(gymnasium.Env):
    """Three turns; each observation reports the length of the last action."""

    def __init__(self) -> None:
        self.observation_space = AnyText(4096)
        self.action_space = AnyText(65536)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.t = 0
        return f"Count to {int(self.np_random.integers(3, 9))}.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.t += 1
        return f"You wrote {len(action)} characters.", float(len(action) > 5), self.t >= 3, False, {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as d:
        create_tiny(f"{d}/m", size="micro", seed=0)
        model, tok = load_policy(f"{d}/m")
    opts = RolloutOptions(max_new_tokens=a.max_new_tokens, max_context=512, max_turns=3, stop_token_ids=(-1,))
    seeds = list(range(a.episodes))

    engine = HFEngine(model, tok, seed=0)
    t0 = time.perf_counter()
    res = asyncio.run(run_episodes(EchoEnv, engine, tok, TrajectoryTree(), a.episodes, opts, seeds=seeds))
    conc_s = time.perf_counter() - t0
    conc_tok = sum(r.policy_tokens for r in res)
    engine.close_sync()

    engine = HFEngine(model, tok, seed=0)
    t0 = time.perf_counter()
    seq_tok = 0
    for s in seeds:
        r = asyncio.run(run_episode(EchoEnv(), engine, tok, TrajectoryTree(), opts, seed=s))
        seq_tok += r.policy_tokens
    seq_s = time.perf_counter() - t0
    engine.close_sync()

    conc, seq = conc_tok / conc_s, seq_tok / seq_s
    print(f"one at a time      {seq:9.1f} tokens/s  ({seq_tok} tokens, {seq_s:.2f}s)")
    print(f"{a.episodes} concurrent      {conc:9.1f} tokens/s  ({conc_tok} tokens, {conc_s:.2f}s)")
    print(f"ratio              {conc / seq:9.2f}x  (goal >= 4x)")


if __name__ == "__main__":
    main()
