"""ALFWorld-v0 latency: reset and step, and the cost of offline game generation.

Prints, from one run on this machine:
* generation seconds per game (sampling + PDDL translation + planning + replay check),
* ``reset`` latency (load the game, translate the PDDL with Fast Downward, first observation),
* ``step`` latency (apply one command, list admissible commands, partial score),
* ``fork`` latency (fresh engine + replay), and the ratios step/reset and fork/reset.

    python benchmarks/alfworld.py [--games 6] [--games-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

# `python benchmarks/alfworld.py` puts this folder first on sys.path, where this file would shadow
# the `alfworld` package: drop it, and make the repository importable.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--games", type=int, default=6, help="games to generate (valid_seen, one per task type)")
    ap.add_argument("--games-dir", default=None, help="use existing games instead of generating")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    from envs.alfworld.env import ALFWorldEnv
    from envs.alfworld.generate import generate

    root = a.games_dir
    if root is None:
        root = tempfile.mkdtemp(prefix="alfworld-bench-")
        t0 = time.perf_counter()
        generate(root, {"valid_seen": a.games}, seed=a.seed, workers=1)
        gen = (time.perf_counter() - t0) / a.games
        print(f"generate: {gen:.2f} s/game (1 worker, {a.games} games)")

    env = ALFWorldEnv(split="valid_seen", games_dir=root, max_turns=200)
    resets, steps, forks = [], [], []
    for i in range(len(env.games)):
        t0 = time.perf_counter()
        env.reset(options={"game": i})
        resets.append(time.perf_counter() - t0)
        for cmd in env.walkthrough:
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(cmd)
            steps.append(time.perf_counter() - t0)
            if len(steps) % 7 == 0 and not (term or trunc):
                t0 = time.perf_counter()
                env.fork()
                forks.append(time.perf_counter() - t0)
            if term or trunc:
                break
    r, s = statistics.median(resets), statistics.median(steps)
    print(f"reset: median {r * 1000:.1f} ms over {len(resets)} games")
    print(f"step:  median {s * 1000:.2f} ms over {len(steps)} steps")
    if forks:
        f = statistics.median(forks)
        print(f"fork:  median {f * 1000:.1f} ms over {len(forks)} forks")
        print(f"ratio fork/reset: {f / r:.2f}")
    print(f"ratio step/reset: {s / r:.3f}")


if __name__ == "__main__":
    main()
