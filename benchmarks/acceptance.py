"""How many paid-for samples does the trust gate keep? Acceptance and held-out success against lag and delta.

Every run starts from the *same* warm-started math-tiny checkpoint (built once: the preset's warm
start, then ``trainer.steps=0``), trains ``--steps`` FlashREINFORCE steps with one ``(lag, delta)``
pair, and reports

* the acceptance rate (share of rows the sequence trust gate admits) and the batch reward per
  window of steps (the collapse guard is off: a collapse is a result here, not a stop);
* held-out success (greedy, the preset's held-out subset) every ``--eval-every`` steps and at the end.

Runs are compared at equal *steps* (equal samples), so the figures do not depend on how busy the
machine is. Two grids:

* ``--grid default`` (the preset's choice): lag 0 and 1 against delta 3e-3 (the paper's), 3e-2, inf;
* ``--grid high-lag``: ``rollout.max_policy_lag`` 8 with the gate on (delta 3e-3) and off (inf):
  does the gate keep training stable where stale rows are many?

Usage::

    python benchmarks/acceptance.py                       # default grid, 300 steps
    python benchmarks/acceptance.py --grid high-lag --steps 300
    python benchmarks/acceptance.py --runs 1:3e-2 1:inf   # chosen (lag:delta) pairs

Runs go two at a time (``--parallel``), one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GRIDS = {
    "default": ["0:3e-3", "1:3e-3", "1:3e-2", "1:inf"],
    "high-lag": ["8:3e-3", "8:inf"],
}


def fr_train(run_dir: Path, overrides: list[str]) -> None:
    """``fr-agents train math-tiny`` in a fresh process (quiet); raises with its output on failure."""
    cmd = [sys.executable, "-m", "fr_agents.cli", "train", "math-tiny", *overrides, "--run-dir", str(run_dir)]
    env = {**os.environ, "FR_AGENTS_LOG": os.environ.get("FR_AGENTS_LOG", "WARNING")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"training failed: {' '.join(cmd)}")


def start_checkpoint(work: Path) -> Path:
    """The warm-started model every run starts from (the preset's warm start, no RL step)."""
    run = work / "start"
    if not (run / "checkpoints" / "step_000000").exists():
        print("building the shared warm-started start (the preset's warm start) ...", flush=True)
        fr_train(run, ["trainer.steps=0", "trainer.eval_episodes=0"])
    return run / "checkpoints" / "step_000000"


def one_run(work: Path, start: Path, lag: int, delta: str, steps: int, eval_every: int, window: int) -> dict:
    run = work / f"lag{lag}_delta{delta}"
    fr_train(
        run,
        [
            f"model.name={start}",
            "warm_start.examples=0",
            f"trainer.steps={steps}",
            "trainer.max_minutes=0",
            "trainer.plateau_patience=0",  # every run takes its steps
            f"trainer.eval_every={eval_every}",
            f"rollout.max_policy_lag={lag}",
            f"objective.delta={delta}",
            # a stability study observes a collapse instead of stopping at it (the batch reward
            # per window shows where the guard would have fired)
            "trainer.collapse_guard=false",
        ],
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    st = [r for r in rows if r.get("kind") == "step"]
    windows = []
    for a in range(0, len(st), window):
        chunk = st[a : a + window]
        windows.append(
            (
                chunk[0]["step"],
                chunk[-1]["step"],
                sum(r["acceptance"] for r in chunk) / len(chunk),
                sum(r["reward"] for r in chunk) / len(chunk),
            )
        )
    evals = [
        (r["step"], r["success"]) for r in rows if r.get("kind") == "eval" and r.get("name") != "after_rl"
    ]
    return {
        "lag": lag,
        "delta": delta,
        "acceptance": windows,
        "evals": evals,
        "mean_acceptance": sum(r["acceptance"] for r in st) / max(1, len(st)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="default")
    ap.add_argument("--runs", nargs="*", default=None, help="LAG:DELTA pairs instead of a grid")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--window", type=int, default=50, help="steps per acceptance window")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--work-dir", default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    pairs = args.runs or GRIDS[args.grid]
    try:
        parsed = [(int(p.split(":")[0]), p.split(":")[1]) for p in pairs]
        for _, d in parsed:
            float(d)
    except (IndexError, ValueError):
        raise SystemExit(f"--runs: expected LAG:DELTA pairs such as 1:3e-2 or 8:inf, got {pairs}") from None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fr-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    start = start_checkpoint(work)
    print(f"{len(parsed)} runs of {args.steps} steps from {start}", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as ex:
        results = list(
            ex.map(
                lambda p: one_run(work, start, p[0], p[1], args.steps, args.eval_every, args.window), parsed
            )
        )
    load1 = os.getloadavg()
    print(
        "\n| lag | delta | acceptance per window | mean | batch reward per "
        "window | held-out success (step: %) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        acc = " ".join(f"{a}-{b}: {v:.2f}" for a, b, v, _ in r["acceptance"])
        rew = " ".join(f"{a}-{b}: {w:.2f}" for a, b, _, w in r["acceptance"])
        ev = " ".join(f"{s}: {100 * v:.1f}" for s, v in r["evals"])
        print(f"| {r['lag']} | {r['delta']} | {acc} | {r['mean_acceptance']:.2f} | {rew} | {ev} |")
    print(
        f"\nload average at start {load0[0]:.1f}, at end {load1[0]:.1f} "
        "(figures are per step, not per second)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": results, "load": [load0, load1]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
