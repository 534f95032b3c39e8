"""Does bfloat16 pay on this machine? Matrix products in float32 and bfloat16, side by side.

``python benchmarks/precision.py [--threads 1] [--repeat 5]``

The presets' ``rollout.dtype: auto`` and ``trainer.autocast: auto`` take bfloat16 only where the
device declares bfloat16 instructions (:mod:`fr_agents.models.precision`). This script checks that
verdict against what the hardware does: it times products of SmolLM2-135M's shapes (hidden 576,
MLP 1536) at a decode step's rows (32) and a learner chunk's (1,024), in each dtype, on the cores
this process is given, and prints GFLOP/s per dtype, bfloat16's speed as a multiple of float32's,
the module's verdict, and the load average (any other process on the cores slows every figure).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

SHAPES = (("decode step, 32 rows", 32, 576, 1536), ("learner chunk, 1,024 rows", 1024, 576, 1536))


def gflops(rows: int, k: int, n: int, dtype: torch.dtype, repeat: int) -> float:
    """Best of ``repeat`` timed rounds of ``rows x k @ k x n`` in ``dtype`` (each round long enough
    to time: at least 50 ms)."""
    a = torch.randn(rows, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    a @ b  # warm-up: kernel selection
    flop = 2 * rows * k * n
    best = 0.0
    for _ in range(repeat):
        count, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < 0.05 or count == 0:
            a @ b
            count += 1
        best = max(best, flop * count / elapsed / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (at most the cores this process is given)"
    )
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per product; the best is reported")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not 1 <= a.threads <= cores:
        raise SystemExit(f"--threads: expected 1..{cores} (the cores this process is given), got {a.threads}")
    torch.set_num_threads(a.threads)
    from fr_agents.models.precision import bfloat16_support

    fast, why = bfloat16_support("cpu")
    print(
        f"torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {a.threads} thread(s)"
    )
    for label, rows, k, n in SHAPES:
        f32 = gflops(rows, k, n, torch.float32, a.repeat)
        bf16 = gflops(rows, k, n, torch.bfloat16, a.repeat)
        print(
            f"{label:<26} {rows}x{k} @ {k}x{n}: float32 {f32:7.1f} GFLOP/s, bfloat16 {bf16:7.1f} GFLOP/s, "
            f"bfloat16 / float32 {bf16 / f32:.3f}"
        )
    print(
        f"verdict of fr_agents.models.precision: bfloat16 {'in hardware' if fast else 'emulated'} ({why}); "
        f"auto takes {'bfloat16' if fast else 'float32'}"
    )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
