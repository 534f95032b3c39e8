"""The episode ledger: which stored leaf holds scheduled episode ``i``.

The trajectory tree stores each distinct sample once, so two episodes that sample bit-identical
tokens (say four GRPO samples all answering ``19``) share one leaf; the learner must still count
that leaf once per episode. The ledger (``RUN_DIR/episodes.sqlite``) maps every finished episode to
its leaf, so batch ``k`` is read back exactly as scheduled, duplicates included.

It is written right after the tree's durable ``finish``. A crash between the two only means the
episode is re-run on resume: the same seed and weights reproduce the same path, the tree reports
the existing leaf (:class:`~fr_agents.tree.store.DuplicateLeafError`), and the ledger learns it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    episode INTEGER PRIMARY KEY,
    batch   INTEGER NOT NULL,
    leaf    INTEGER NOT NULL,
    reward  REAL NOT NULL,
    tokens  INTEGER NOT NULL,
    version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_batch ON episodes(batch);
"""


class EpisodeLedger:
    """Thread-safe map episode -> (leaf, reward, policy tokens, version), durable in SQLite (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)

    def record(self, episode: int, batch: int, leaf: int, reward: float, tokens: int, version: int) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO episodes VALUES (?,?,?,?,?,?)",
                (episode, batch, leaf, float(reward), int(tokens), int(version)),
            )

    def leaves(self, episodes: Iterable[int]) -> dict[int, int]:
        """``{episode: leaf}`` for those of ``episodes`` that have finished."""
        eps = list(episodes)
        if not eps:
            return {}
        with self._lock:
            marks = ",".join("?" * len(eps))
            rows = self._conn.execute(f"SELECT episode, leaf FROM episodes WHERE episode IN ({marks})", eps).fetchall()
        return {int(e): int(leaf) for e, leaf in rows}

    def batch_rows(self, batch: int) -> list[tuple[int, int, float, int, int]]:
        """``(episode, leaf, reward, tokens, version)`` of batch ``batch``, by episode."""
        with self._lock:
            return [
                (int(e), int(lf), float(r), int(t), int(v))
                for e, lf, r, t, v in self._conn.execute(
                    "SELECT episode, leaf, reward, tokens, version FROM episodes WHERE batch = ? ORDER BY episode",
                    (batch,),
                )
            ]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
