"""Sandbox latency: session start, warm call and pooled acquire, per backend.

    python benchmarks/sandbox.py [--backend docker|bwrap|all] [--starts 10] [--calls 300] [--json]

Prints p50/p95 of

* ``start``   open a session and wait for its worker's ready frame (what an episode waits for without
  a pool);
* ``call``    one ``run_python("1")`` round trip on a warm session (the per-tool-call overhead);
* ``acquire`` ``SandboxPool.acquire()`` with the pool warm (what an episode waits for with a pool);

next to the issue's goals, and the ratios measured in this run (figure / goal; start / acquire, the
speed-up the pool buys). The machine's load average is printed too: absolute times on a shared
2-core box move with it, the ratios much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools_sandbox import SandboxLimits, SandboxPool, create_sandbox  # noqa: E402
from tools_sandbox.factory import backend_status  # noqa: E402

GOALS_MS = {  # from issue 8
    "docker": {"call_p50": 2.0, "start_p50": 400.0, "acquire_p50": 20.0},
    "bwrap": {"call_p50": 1.0, "start_p50": 150.0, "acquire_p50": 20.0},
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench(backend: str, starts: int, calls: int) -> dict:
    limits = SandboxLimits()
    start_ms = []
    for _ in range(starts):
        t0 = time.perf_counter()
        sb = create_sandbox(backend, limits)
        start_ms.append((time.perf_counter() - t0) * 1000)
        sb.close()
    call_ms = []
    with create_sandbox(backend, limits) as sb:
        for _ in range(20):
            sb.run_python("1")
        for _ in range(calls):
            t0 = time.perf_counter()
            r = sb.run_python("1")
            call_ms.append((time.perf_counter() - t0) * 1000)
            assert r.ok
    acquire_ms = []
    with SandboxPool(backend, limits, size=2) as pool:
        for _ in range(max(5, starts)):
            pool.wait_ready(120)
            t0 = time.perf_counter()
            sb = pool.acquire()
            acquire_ms.append((time.perf_counter() - t0) * 1000)
            sb.close()
    out = {}
    for name, xs in (("start", start_ms), ("call", call_ms), ("acquire", acquire_ms)):
        out[f"{name}_p50"] = statistics.median(xs)
        out[f"{name}_p95"] = pct(xs, 0.95)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="all", choices=["all", "docker", "bwrap"])
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    status = backend_status()
    backends = ["docker", "bwrap"] if a.backend == "all" else [a.backend]
    results = {}
    for b in backends:
        ok, why = status[b]
        if not ok:
            print(f"{b}: skipped ({why})")
            continue
        results[b] = bench(b, a.starts, a.calls)
    load = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"load1": load, "results": results, "goals_ms": GOALS_MS}))
        return 0
    print(f"sandbox latency (ms); load average {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'backend':<8} {'figure':<8} {'p50':>9} {'p95':>9} {'goal p50':>9} {'p50/goal':>9}")
    for b, r in results.items():
        for fig in ("start", "call", "acquire"):
            goal = GOALS_MS[b][f"{fig}_p50"]
            p50 = r[f"{fig}_p50"]
            print(f"{b:<8} {fig:<8} {p50:9.3f} {r[f'{fig}_p95']:9.3f} {goal:9.1f} {p50 / goal:9.2f}")
        print(f"{b:<8} pool speed-up (start p50 / acquire p50): {r['start_p50'] / r['acquire_p50']:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
