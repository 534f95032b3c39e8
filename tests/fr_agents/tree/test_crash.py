"""Crash safety: writer processes killed with SIGKILL never lose an acknowledged leaf.

Each round forks two writer processes (``crash_writer.main``) that share one store file, kills
both with SIGKILL at a random moment, then reopens the store and checks SQLite's integrity and
every leaf a writer acknowledged (i.e. whose ``finish`` had returned) across all rounds so far.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from fr_agents.tree import TrajectoryTree

sys.path.insert(0, str(Path(__file__).parent))
import crash_writer  # noqa: E402

ROUNDS = 20


def _spawn(path: Path, seed: int) -> tuple[int, int]:
    """Fork a writer; returns (pid, read end of its acknowledgement pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            crash_writer.main(str(path), seed, os.fdopen(w, "w"))
        finally:
            os._exit(1)
    os.close(w)
    return pid, r


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _acks(raw: bytes) -> list[dict]:
    """Complete JSON lines only: a kill may cut the last line short."""
    out = []
    for line in raw.decode(errors="replace").split("\n")[1:]:  # first line is "ready"
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkilled_writers_never_lose_acknowledged_leaves(tmp_path):
    path = tmp_path / "crash.db"
    TrajectoryTree.open(path).close()  # create the file once so both writers race only on data
    rng = random.Random(1234)
    acked: dict[int, dict] = {}
    for rnd in range(ROUNDS):
        writers = [_spawn(path, rnd * 10 + k) for k in range(2)]
        time.sleep(rng.uniform(0.05, 0.5))
        for pid, _ in writers:
            os.kill(pid, signal.SIGKILL)
        for pid, fd in writers:
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            for a in _acks(_read_all(fd)):
                acked[a["leaf"]] = a
        # the file reopens, passes SQLite's own check, and holds every acknowledged leaf intact
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
        with TrajectoryTree.open(path) as tree:
            leaves = set(tree.leaf_ids())
            for leaf, a in acked.items():
                assert leaf in leaves, f"round {rnd}: acknowledged leaf {leaf} lost"
                t = tree.trajectory(leaf)
                assert t.token_ids == a["tokens"]
                assert t.logprobs == a["logprobs"]
                assert t.policy_mask == a["mask"]
                assert t.versions == a["versions"]
                assert t.reward == a["reward"]
            assert tree.stats()["leaves"] >= len(acked)
    assert len(acked) > 50, f"the writers acknowledged only {len(acked)} leaves"
