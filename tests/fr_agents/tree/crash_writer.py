"""A rollout-like writer for the crash test: appends and finishes forever, acknowledging leaves.

Usage: ``python crash_writer.py STORE SEED`` (the test forks :func:`main` instead, to skip the
start-up cost). After each ``finish`` returns, one JSON line with the leaf id and the exact
trajectory it expects is written (after a first ``ready`` line) to ``out`` and flushed. The test kills
this process with SIGKILL at a random moment and then checks every acknowledged leaf.
"""

from __future__ import annotations

import json
import random
import sys
from typing import TextIO

from fr_agents.tree import TrajectoryTree


def main(path: str, seed: int, out: TextIO = sys.stdout) -> None:
    rng = random.Random(seed)
    tree = TrajectoryTree.open(path)
    paths: dict[int, tuple[list[int], list[float], list[bool], list[int]]] = {}
    out.write("ready\n")
    out.flush()
    while True:
        prompt = [rng.randrange(3) for _ in range(rng.randint(1, 3))]
        node = tree.add_root(prompt)
        paths[node] = (prompt, [0.0] * len(prompt), [False] * len(prompt), [-1] * len(prompt))
        for _turn in range(rng.randint(1, 3)):
            if rng.random() < 0.3:  # fork from something this writer wrote before
                node = rng.choice(list(paths))
            n = rng.randint(1, 40)
            toks = [rng.randrange(4) for _ in range(n)]
            pol = rng.random() < 0.7
            lps = [-rng.randrange(1, 9) / 8 for _ in range(n)]  # exact in float32
            ver = rng.randrange(2)
            child = tree.append(node, toks, lps, pol, ver)
            t, lp, m, v = paths[node]
            paths[child] = (
                t + toks,
                lp + (lps if pol else [0.0] * n),
                m + [pol] * n,
                v + [ver if pol else -1] * n,
            )
            node = child
        if len(paths[node][0]) == 0 or all(not x for x in paths[node][2]) and rng.random() < 0.5:
            continue
        reward = rng.randrange(3) / 2
        try:
            leaf = tree.finish(node, reward, info={"seed": seed})
        except ValueError:  # a root, or a path finished before (by us or the other writer)
            continue
        t, lp, m, v = paths[leaf]
        ack = {"leaf": leaf, "tokens": t, "logprobs": lp, "mask": m, "versions": v, "reward": reward}
        out.write(json.dumps(ack) + "\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
