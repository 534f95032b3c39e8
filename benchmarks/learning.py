"""Does `fr-agents train math-tiny` learn on a laptop-class CPU? And FlashREINFORCE vs GRPO.

Part 1 runs the embedded default exactly as a user would (``fr-agents train math-tiny``, a fresh
process, the preset's own time budget) and prints held-out success (greedy, on the test split the
training never sees) at three points, so each lift is reported on its own:

* before anything (the randomly initialised tiny model);
* after the short supervised warm start (``warm_start.examples`` labelled demos);
* after RL (asynchronous FlashREINFORCE on the unlabelled rest of the train split).

Goal: RL adds >= 30 points within 10 minutes of wall time on 2 cores.

Part 2 compares, on the same task and from the same warm start, FlashREINFORCE with ``N`` rollouts
(``S`` steps of ``B``) against GRPO with 4 samples per prompt and ``2N`` rollouts (``2S`` steps).

Usage::

    python benchmarks/learning.py                    # both parts
    python benchmarks/learning.py --skip-compare     # part 1 only
    python benchmarks/learning.py --compare-steps 60 --skip-main

The load average of the machine is printed next to the figures: other processes sharing the two
cores slow every step, so wall-time figures are only comparable at similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train(run_dir: Path, overrides: list[str], *, preset: str = "math-tiny") -> tuple[dict, float, int]:
    """Run ``fr-agents train`` in a fresh process; returns (evals by name, wall seconds, steps)."""
    cmd = [sys.executable, "-m", "fr_agents.cli", "train", preset, *overrides, "--run-dir", str(run_dir)]
    env = {**os.environ, "FR_AGENTS_LOG": os.environ.get("FR_AGENTS_LOG", "WARNING")}
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"training failed ({' '.join(cmd)})")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = {r["name"]: r for r in rows if r.get("kind") == "eval"}
    steps = max((r["step"] for r in rows if r.get("kind") == "step"), default=0)
    return evals, wall, steps


def pct(ev: dict | None) -> str:
    return "n/a" if ev is None else f"{100 * ev['success']:5.1f}%"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-main", action="store_true")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--compare-steps", type=int, default=80, help="FlashREINFORCE steps S (GRPO gets 2S)")
    ap.add_argument("--minutes", type=float, default=None, help="override the preset's RL time budget")
    ap.add_argument("--out", default=None, help="keep the run directories here")
    a = ap.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="fr-learning-"))
    print(f"# fr-agents learning benchmark ({os.cpu_count()} cores, {load()}); runs in {root}")

    if not a.skip_main:
        extra = [f"trainer.max_minutes={a.minutes}"] if a.minutes else []
        evals, wall, steps = train(root / "math-tiny", extra)
        before, warm, rl = evals.get("before"), evals.get("after_warm_start"), evals.get("after_rl")
        print("\n## fr-agents train math-tiny")
        print(f"held-out success before training   : {pct(before)}")
        print(f"held-out success after warm start  : {pct(warm)}   (warm-start lift {100 * (warm['success'] - before['success']):+.1f} points)")
        print(f"held-out success after RL          : {pct(rl)}   (RL lift {100 * (rl['success'] - warm['success']):+.1f} points)")
        print(f"RL steps {steps}, wall time {wall / 60:.1f} min for the whole command ({load()})")
        lift = 100 * (rl["success"] - warm["success"])
        print(f"goal (+30 points from RL within 10 minutes): {'met' if lift >= 30 and wall <= 600 else 'NOT met'}")

    if not a.skip_compare:
        s = a.compare_steps
        common = ["trainer.max_minutes=0", "trainer.checkpoint_every=0", "trainer.collapse_guard=false"]
        fr, fr_wall, _ = train(root / "flashreinforce", [*common, f"trainer.steps={s}"])
        grpo, grpo_wall, _ = train(
            root / "grpo", [*common, f"trainer.steps={2 * s}", "objective.algo=grpo", "objective.grpo_group_size=4"]
        )
        from fr_agents.config import load_config

        b = load_config("math-tiny").trainer.batch_size
        print(f"\n## same task, same warm start: FlashREINFORCE N={s * b} rollouts vs GRPO (4/prompt) 2N={2 * s * b}")
        print(f"{'method':<28}{'rollouts':>10}{'after warm':>12}{'after RL':>10}{'RL lift':>9}{'wall':>8}")
        for name, ev, n, w in (("FlashREINFORCE", fr, s * b, fr_wall), ("GRPO, 4 samples/prompt", grpo, 2 * s * b, grpo_wall)):
            warm, rl = ev["after_warm_start"], ev["after_rl"]
            print(
                f"{name:<28}{n:>10}{pct(warm):>12}{pct(rl):>10}{100 * (rl['success'] - warm['success']):>+8.1f}"
                f"{w / 60:>7.1f}m"
            )
        print(f"({load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
