"""Verifier throughput and MathVerifier-v0 step overhead (no model involved).

Prints, measured in this one run:

* math-verify checks/s through the process pool with 1 worker and with N workers (and the ratio);
* checks/s on the fast path (identical or plain-integer answers: the tiny curriculum's case);
* env ``reset`` + ``step`` overhead per episode for ``plain`` and ``boxed`` replies, and the share
  of that overhead spent in verification.

Usage: ``python benchmarks/verifier.py [--workers N] [--checks K]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gymnasium  # noqa: E402

import envs  # noqa: E402,F401
from envs.verifier import VerifierPool  # noqa: E402

# Pairs that need real math-verify work (none is decided by the fast path).
MV_PAIRS = [
    ("1/2", "0.5"),
    (r"\frac{3}{4}", "0.75"),
    ("x=3", "3"),
    (r"\{1,2\}", r"\{2,1\}"),
    ("[1,2)", "(1,2)"),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"5\text{ cm}", "5"),
]


def checks_per_second(pool: VerifierPool, pairs: list[tuple[str, str]], n: int, threads: int) -> float:
    work = [pairs[i % len(pairs)] for i in range(n)]
    pool.check_many(work[: pool.workers * 2])  # warm-up: workers started, caches filled
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as ex:
        list(ex.map(lambda gp: pool.check(*gp), work))
    return n / (time.perf_counter() - t0)


def env_overhead(pool: VerifierPool, answer_format: str, n: int) -> tuple[float, float]:
    """(seconds per reset+step, fraction of it inside verification) for correct replies."""
    env = gymnasium.make("fr_agents/MathVerifier-v0", pool=pool, answer_format=answer_format)
    env.reset(seed=0)
    verify_s = 0.0
    t0 = time.perf_counter()
    for i in range(n):
        env.reset(seed=i)
        ans = env.unwrapped.task["answer"]
        reply = ans if answer_format == "plain" else f"The sum is \\boxed{{{ans}.0}}"
        info = env.step(reply)[4]
        assert info["correct"], info
        verify_s += info["verify_seconds"]
    total = time.perf_counter() - t0
    return total / n, verify_s / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--checks", type=int, default=400)
    ap.add_argument("--episodes", type=int, default=300)
    a = ap.parse_args()

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, 1-min load average {load:.1f} (pool scaling needs idle cores)")
    with VerifierPool(workers=1, eager=True) as one, VerifierPool(workers=a.workers, eager=True) as many:
        r1 = checks_per_second(one, MV_PAIRS, a.checks, threads=1)
        rn = checks_per_second(many, MV_PAIRS, a.checks, threads=a.workers * 2)
        fast = checks_per_second(
            many, [("19", "19"), ("19", "18"), ("127", "0127")], a.checks * 50, threads=1
        )
        print(f"math-verify checks/s, pool of 1 worker:     {r1:9.1f}")
        print(
            f"math-verify checks/s, pool of {a.workers} workers:    {rn:9.1f}  "
            f" ({rn / r1:.2f}x the 1-worker pool)"
        )
        print(
            f"fast-path checks/s (plain integers):        {fast:9.1f}   "
            f"({fast / rn:.0f}x the pooled math-verify rate)"
        )
        plain_s, plain_share = env_overhead(many, "plain", a.episodes)
        boxed_s, boxed_share = env_overhead(many, "boxed", a.episodes // 3)
        print(
            f"env reset+step, plain reply (fast path):    {plain_s * 1e6:9.1f} "
            f"us/episode   (verify share {plain_share:.0%})"
        )
        print(
            f"env reset+step, boxed '12.0'-style reply:   {boxed_s * 1e6:9.1f} us/episode   "
            f"(verify share {boxed_share:.0%}; {boxed_s / plain_s:.0f}x the plain step)"
        )


if __name__ == "__main__":
    main()
