"""The compact forward (``model.compact_forward``, :mod:`fr_agents.models.compact`) on and off.

``python benchmarks/compact_forward.py [--batches 30] [--rounds 3] [key=value ...]``

Two measurements on the preset's own work (math-tiny by default; pass ``model.name=DIR`` for a
trained policy, e.g. ``benchmarks/vs_trl.py``'s ``WORK/start``, whose answers are what RL sees):

* **the learner's step**: real batches (the preset's rollout, run once here into a temporary
  store, exported as the loop exports them) stepped by the preset's learner with the compact
  forward on and off, in fresh processes, alternating; CPU milliseconds per step;
* **the rollout's engine**: the preset's rollout alone (``benchmarks/rollout.py --cpu``'s
  measurement, same warm-up and batches) with the setting on and off, alternating; CPU
  milliseconds of the engine thread and of the whole process per batch.

Prints each run, the medians per setting and their ratio, and the load average. Both sides run
with one torch thread, as the preset's loop does on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {"on": "model.compact_forward=true", "off": "model.compact_forward=false"}


def make_batches(preset: str, batches: int, overrides: list[str], out: str) -> None:
    """Run ``batches + 5`` of the preset's rollout batches into a store and save them as flat
    batches (``torch.save``) at ``out``."""
    from fr_agents.config import load_config
    from trainer.parts import build_rollout_side

    cfg = load_config(preset, ["warm_start.examples=0", *overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        side = build_rollout_side(cfg, run_dir)
        sem = asyncio.Semaphore(cfg.rollout.concurrency)

        async def one(spec: Any) -> None:
            async with sem:
                await side.runner.run(spec)

        async def go() -> None:
            for k in range(batches + 5):
                await asyncio.gather(*(one(s) for s in side.schedule.episodes(k)))

        asyncio.run(go())
        leaves = side.tree.leaf_ids()
        size = cfg.trainer.batch_size
        flats = [side.tree.export_flat(leaves[i * size : (i + 1) * size]) for i in range(len(leaves) // size)]
        side.close()
    torch.save(flats, out)


def learner_child(preset: str, overrides: list[str], path: str) -> dict[str, Any]:
    """CPU milliseconds of each learner step over the saved batches (the first 5 warm up)."""
    from fr_agents.config import load_config
    from fr_agents.models import load_policy
    from trainer.learner import Learner
    from trainer.parts import model_dir

    cfg = load_config(preset, ["warm_start.examples=0", *overrides])
    model, _ = load_policy(str(model_dir(cfg)), cfg.model.dtype)
    model.train()
    learner = Learner.from_config(model, cfg)
    flats = torch.load(path, weights_only=False)
    times = []
    for i, flat in enumerate(flats):
        t0 = time.process_time()
        learner.step(flat)
        if i >= 5:
            times.append((time.process_time() - t0) * 1000)
    return {
        "step_ms": statistics.median(times),
        "steps": len(times),
        "compact": learner.policy.compact_reason is None,
    }


def run_child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="math-tiny")
    ap.add_argument("--batches", type=int, default=30, help="timed batches per run (each side)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per setting (each side)")
    ap.add_argument("--learner-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the preset")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.learner_child:
        print(json.dumps(learner_child(a.preset, a.overrides, a.learner_child)))
        return
    print(f"preset {a.preset}, {a.batches} timed batches per run, {a.rounds} rounds alternating on/off")
    medians: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/batches.pt"
        make_batches(a.preset, a.batches, [*a.overrides, SETTINGS["off"]], path)
        steps: dict[str, list[float]] = {k: [] for k in SETTINGS}
        for r in range(a.rounds):
            for name, setting in SETTINGS.items():
                res = run_child(
                    [__file__, "--learner-child", path, "--preset", a.preset, *a.overrides, setting]
                )
                assert res["compact"] == (name == "on"), "the setting did not reach the learner"
                steps[name].append(res["step_ms"])
                print(
                    f"learner round {r} {name:<3}: step CPU "
                    f"{res['step_ms']:6.1f} ms (median of {res['steps']})"
                )
        for name in SETTINGS:
            medians["learner", name] = statistics.median(steps[name])
    engine: dict[str, list[dict[str, Any]]] = {k: [] for k in SETTINGS}
    for r in range(a.rounds):
        for name, setting in SETTINGS.items():
            res = run_child(
                [
                    os.path.join(HERE, "rollout.py"),
                    "--cpu-child",
                    "--preset",
                    a.preset,
                    "--batches",
                    str(a.batches),
                    *a.overrides,
                    setting,
                ]
            )
            engine[name].append(res)
            print(
                f"rollout round {r} {name:<3}: engine thread {res['threads_ms'].get('HFEngine', 0.0):6.1f} "
                f"ms, process {res['cpu_ms']:6.1f} ms, wall {res['wall_ms']:6.1f} ms per batch"
            )
    for name in SETTINGS:
        medians["engine", name] = statistics.median(
            x["threads_ms"].get("HFEngine", 0.0) for x in engine[name]
        )
        medians["rollout", name] = statistics.median(x["cpu_ms"] for x in engine[name])
    for what, label in (
        ("learner", "learner step CPU"),
        ("engine", "engine CPU per batch"),
        ("rollout", "rollout process CPU per batch"),
    ):
        on, off = medians[what, "on"], medians[what, "off"]
        print(f"median {label:<30}: on {on:6.1f} ms, off {off:6.1f} ms, on/off {on / off:.2f}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
