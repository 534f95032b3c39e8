"""Elastic pools vs colocated-sync vs the best static async split on the xlong workload (simulated).

Prints the three throughputs (trajectories/s, all from one simulator run of the same episodes),
the two speedups with the acceptance thresholds (>= 1.85x vs colocated, >= 1.78x vs the best
static async split; goals 2.0 and 1.9), the critical-path upper bound that no device policy can
beat (how much room reallocation has at all), the colocated-async reference (the whole cluster
handed to every training step and back: what reallocation without drain costs would reach), and
writes a plot of the elastic run's pool sizes.
The workload and hardware constants are documented in trainer/elastic/simulator.py (WORKLOADS).

``--sensitivity`` also prints, for variants of the workload (staleness bound, training cost, tail
weight), how far the colocated-async reference and the bound get above the best static split
there: whether any reallocation could reach the goals on a nearby workload (about five minutes).

Usage: ``python benchmarks/elastic_sim.py [--gpus 16] [--workload xlong] [--plot elastic_pools.png]
[--also-batch 256] [--sensitivity]`` (about two minutes on one core).
"""

from __future__ import annotations

import argparse
import time

from trainer.elastic.simulator import (
    best_static,
    compare,
    critical_path_bound,
    get_workload,
    plot_pools,
    simulate,
)

# workload variants for --sensitivity: (label, overrides)
VARIANTS = (
    ("max_policy_lag 0", {"max_policy_lag": 0}),
    ("max_policy_lag 1", {"max_policy_lag": 1}),
    ("training 3x dearer", {"train_tokens_per_s": 2000.0}),
    ("training 3x dearer, lag 1", {"train_tokens_per_s": 2000.0, "max_policy_lag": 1}),
    ("heavier turn tail (sigma 1.3)", {"turns_sigma": 1.3}),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="xlong")
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="elastic_pools.png")
    ap.add_argument(
        "--also-batch",
        type=int,
        nargs="*",
        default=[256],
        help="also report the speedups at these batch sizes (sensitivity; default 256, none: --also-batch)",
    )
    ap.add_argument(
        "--sensitivity", action="store_true", help="reference and bound vs best static on workload variants"
    )
    a = ap.parse_args()
    w = get_workload(a.workload)
    if a.steps:
        w = w.with_overrides(steps=a.steps)
    t = time.perf_counter()
    res = compare(w, a.gpus, seed=a.seed)
    plot_pools(res, a.plot)
    tp = res["throughput"]
    print(
        f"{w.name} on {a.gpus} GPUs, {w.steps} steps x {w.batch_size} "
        f"trajectories (simulated in {time.perf_counter() - t:.0f}s)"
    )
    print(f"  colocated-sync     {tp['colocated']:.3f} traj/s")
    print(
        f"  best static async  {tp['static_async']:.3f} traj/s  (rollout "
        f"{res['best_static_rollout_devices']} / train "
        f"{a.gpus - res['best_static_rollout_devices']}; grid {res['static_grid']})"
    )
    e = res["elastic"]
    print(
        f"  elastic            {tp['elastic']:.3f} traj/s  ({e['moves']} moves, "
        f"{e['migrations']} re-prefills, {e['finished_in_place']} finished in place)"
    )
    for key, need, goal in (("speedup_vs_colocated", 1.85, 2.0), ("speedup_vs_static_async", 1.78, 1.9)):
        v = res[key]
        verdict = "GOAL" if v >= goal else "PASS" if v >= need else "MISS"
        print(f"  {key:<24} {v:.2f}x  (need >= {need}, goal {goal}): {verdict}")
    print(
        "  upper bound for any device policy (critical path, "
        f"trainer.elastic.simulator.critical_path_bound): {res['bound_throughput']:.3f} traj/s = "
        f"{res['bound_vs_colocated']:.2f}x colocated, {res['bound_vs_static_async']:.2f}x best static async"
    )
    print(
        "  reference, colocated-async (every device to every step and back at "
        f"the colocated switch cost): {res['colocated_async_throughput']:.3f} "
        f"traj/s = {res['colocated_async_vs_static_async']:.2f}x best static async"
    )
    print(f"  pool sizes over time: {a.plot}")
    for b in a.also_batch:
        r = compare(w.with_overrides(batch_size=b), a.gpus, seed=a.seed)
        print(
            f"  at B={b}: elastic {r['speedup_vs_colocated']:.2f}x colocated, "
            f"{r['speedup_vs_static_async']:.2f}x best static (rollout "
            f"{r['best_static_rollout_devices']}, learner busy "
            f"{r['static_async']['learner_busy_frac']:.0%}); bound {r['bound_vs_static_async']:.2f}x best "
            f"static, colocated-async {r['colocated_async_vs_static_async']:.2f}x"
        )

    if a.sensitivity:
        print("  sensitivity (static search + colocated-async reference + bound per variant):")
        for label, kw in VARIANTS:
            v = w.with_overrides(**kw)
            st, _ = best_static(v, a.gpus, seed=a.seed)
            ref = simulate(v, a.gpus, "colocated_async", seed=a.seed).throughput
            bound = critical_path_bound(v, a.gpus, a.seed)
            print(
                f"    {label:<32} best static {st.throughput:.3f} traj/s (rollout {st.rollout_devices}); "
                f"colocated-async {ref / st.throughput:.2f}x, bound {bound / st.throughput:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
