"""The episode ledger: which stored leaf holds scheduled episode ``i``.

The trajectory tree stores each distinct sample once, so two episodes that sample bit-identical
tokens (say four GRPO samples all answering ``19``) share one leaf; the learner must still count
that leaf once per episode. The ledger (``RUN_DIR/episodes.sqlite``) maps every finished episode to
its leaf, so batch ``k`` is read back exactly as scheduled, duplicates included.

A branching episode has several leaves: the ledger holds one row per leaf, numbered ``branch``
0, 1, … in the episode's depth-first order, and :meth:`EpisodeLedger.record_episode` writes all of
an episode's rows in one transaction, so an episode is either wholly acknowledged or re-run.

It is written right after the tree's durable ``finish``. A crash between the two only means the
episode is re-run on resume: the same seed and weights reproduce the same path, the tree reports
the existing leaf (:class:`~fr_agents.tree.store.DuplicateLeafError`), and the ledger learns it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS episode_leaves (
    episode INTEGER NOT NULL,
    branch  INTEGER NOT NULL,
    batch   INTEGER NOT NULL,
    leaf    INTEGER NOT NULL,
    reward  REAL NOT NULL,
    tokens  INTEGER NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (episode, branch)
);
CREATE INDEX IF NOT EXISTS episode_leaves_batch ON episode_leaves(batch);
"""


class EpisodeLedger:
    """Thread-safe map episode -> its leaves (leaf, reward, policy tokens, version), durable in SQLite (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """A run directory from before branching holds one leaf per episode in table ``episodes``:
        its rows become branch 0 of ``episode_leaves`` (so such a run still resumes)."""
        old = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'episodes'").fetchone()
        if old:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR IGNORE INTO episode_leaves SELECT episode, 0, batch, leaf, reward, tokens, version FROM episodes"
            )
            self._conn.execute("DROP TABLE episodes")
            self._conn.execute("COMMIT")

    def record(self, episode: int, batch: int, leaf: int, reward: float, tokens: int, version: int) -> None:
        """Record a linear (one-leaf) episode."""
        self.record_episode(episode, batch, [(leaf, reward, tokens)], version)

    def record_episode(self, episode: int, batch: int, leaves: list[tuple[int, float, int]], version: int) -> None:
        """Record all leaves ``(leaf, reward, policy tokens)`` of one episode in one transaction."""
        if not leaves:
            raise ValueError(f"leaves: episode {episode} has no leaf")
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("DELETE FROM episode_leaves WHERE episode = ?", (episode,))
                self._conn.executemany(
                    "INSERT INTO episode_leaves VALUES (?,?,?,?,?,?,?)",
                    [
                        (episode, i, batch, int(leaf), float(reward), int(tokens), int(version))
                        for i, (leaf, reward, tokens) in enumerate(leaves)
                    ],
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def record_outcome(self, spec: Any, outcome: Any) -> None:
        """Record an :class:`~trainer.episodes.EpisodeOutcome` of scheduled episode ``spec``."""
        rows = [(x.leaf_id, x.reward, x.policy_tokens) for x in outcome.leaves]
        self.record_episode(spec.episode, spec.batch, rows, spec.version)

    def leaves(self, episodes: Iterable[int]) -> dict[int, int]:
        """``{episode: leaf}`` (its first leaf) for those of ``episodes`` that have finished."""
        eps = list(episodes)
        if not eps:
            return {}
        with self._lock:
            marks = ",".join("?" * len(eps))
            rows = self._conn.execute(f"SELECT episode, leaf FROM episode_leaves WHERE branch = 0 AND episode IN ({marks})", eps).fetchall()
        return {int(e): int(leaf) for e, leaf in rows}

    def batch_rows(self, batch: int) -> list[tuple[int, int, float, int, int]]:
        """``(episode, leaf, reward, tokens, version)`` of batch ``batch``: one row per leaf, by
        episode then branch."""
        with self._lock:
            return [
                (int(e), int(lf), float(r), int(t), int(v))
                for e, lf, r, t, v in self._conn.execute(
                    "SELECT episode, leaf, reward, tokens, version FROM episode_leaves WHERE batch = ? ORDER BY episode, branch",
                    (batch,),
                )
            ]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
