"""How robust is a preset's warm start? Held-out success after the warm start, per recipe, across
seeds and thread counts.

The warm start (``warm_start.*``) is deterministic for a given machine and thread count, but a
recipe on the edge of stability turns float summation order into a different model: the same
recipe can score 21.7% on one thread and 6.5% on two. A recipe worth shipping scores about the same
whatever the seed and the cores. For each recipe this runs, each in a fresh process:

* ``trainer.seed`` = each of ``--seeds`` on every core this process is given;
* ``trainer.seed`` = the first seed on one core (the process pinned to the first usable CPU, as
  ``taskset -c 0`` does), unless ``--no-one-core``;

and prints held-out success (greedy, on ``--episodes`` problems of the test split, default: all
1,000 of math-tiny) after the warm start, with the mean and max - min per recipe. The warm start
and the evaluation are the product's own (:func:`trainer.warm_start.warm_start_score`).

Usage::

    python benchmarks/warm_start.py                                  # the preset's own recipe
    python benchmarks/warm_start.py --recipe "lr 1e-3 const=" \\
        --recipe "cosine=warm_start.schedule=cosine" \\
        --recipe "2000 demos=warm_start.examples=2000 warm_start.epochs=7 warm_start.schedule=cosine"
    python benchmarks/warm_start.py --json out.json

A recipe is ``NAME=OVERRIDES`` (space-separated ``key=value`` overrides on top of the preset).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(preset: str, overrides: list[str], run_dir: Path, cpus: list[int] | None) -> dict:
    """One warm start in a fresh process (pinned to ``cpus`` when given); its figures."""
    code = (
        "import json, sys\n"
        "from fr_agents.config import load_config\n"
        "from trainer.warm_start import warm_start_score\n"
        "cfg = load_config(sys.argv[1], json.loads(sys.argv[2]))\n"
        "res = warm_start_score(cfg, sys.argv[3])\n"
        "print('RESULT ' + json.dumps({k: v for k, v in res.items() if k != 'by_group'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["FR_AGENTS_LOG"] = env.get("FR_AGENTS_LOG", "WARNING")
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, preset, json.dumps(overrides), str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"warm start failed: {preset} {' '.join(overrides)}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return {**json.loads(line.removeprefix("RESULT ")), "wall_s": time.perf_counter() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="math-tiny")
    ap.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="NAME=OVERRIDES",
        help="a recipe: a name, '=', then overrides (repeatable; default: the preset's own)",
    )
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="trainer.seed values on every core"
    )
    ap.add_argument("--no-one-core", action="store_true", help="skip the run of the first seed on one core")
    ap.add_argument("--episodes", type=int, default=1000, help="held-out problems (trainer.eval_episodes)")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = ap.parse_args()

    recipes = []
    for text in a.recipe or ["preset="]:
        name, sep, rest = text.partition("=")
        if not sep:
            raise SystemExit(f"--recipe {text!r}: expected NAME=OVERRIDES")
        recipes.append((name.strip(), shlex.split(rest)))
    from trainer.os_tuning import cores_given, usable_cpus

    cores = cores_given()
    first = usable_cpus()[:1] or None
    runs = [(f"seed {s}, {cores} cores", s, None) for s in a.seeds]
    if not a.no_one_core and cores > 1 and first:
        runs.append((f"seed {a.seeds[0]}, 1 core", a.seeds[0], first))
    print(
        f"{a.preset}: warm start then held-out success on {a.episodes} problems; {cores} cores given; "
        f"load average {tuple(round(x, 2) for x in os.getloadavg())}",
        flush=True,
    )
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="warm_start_"))
    report = []
    for name, overrides in recipes:
        scores = []
        for label, seed, cpus in runs:
            run_dir = work / f"{name.replace(' ', '_')}-{label.replace(' ', '').replace(',', '_')}"
            run_dir.mkdir(parents=True, exist_ok=True)
            res = one_run(
                a.preset,
                [*overrides, f"trainer.seed={seed}", f"trainer.eval_episodes={a.episodes}"],
                run_dir,
                cpus,
            )
            scores.append(100 * res["success"])
            report.append({"recipe": name, "overrides": overrides, "run": label, **res})
            print(
                f"  {name:<24} {label:<18} held-out {100 * res['success']:5.1f}%   warm start {res['steps']} "
                f"steps, {res['seconds']:.0f} s on {res['threads']} threads, loss {res['loss']:.3f}",
                flush=True,
            )
        spread = max(scores) - min(scores)
        mean = statistics.mean(scores)
        print(
            f"{name:<26} mean {mean:5.1f}%  max - min {spread:4.1f} points  "
            f"({' / '.join(f'{x:.1f}' for x in scores)})",
            flush=True,
        )
    print(f"load average at the end {tuple(round(x, 2) for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
