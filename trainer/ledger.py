"""The episode ledger: which stored leaf holds scheduled episode ``i``.

The trajectory tree stores each distinct sample once, so two episodes that sample bit-identical
tokens (say four GRPO samples all answering ``19``) share one leaf; the learner must still count
that leaf once per episode. The ledger (``RUN_DIR/episodes.sqlite``) maps every finished episode to
its leaf, so batch ``k`` is read back exactly as scheduled, duplicates included.

A branching episode has several leaves: the ledger holds one row per leaf, numbered ``branch``
0, 1, … in the episode's depth-first order, and :meth:`EpisodeLedger.record_episode` writes all of
an episode's rows in one transaction, so an episode is either wholly acknowledged or re-run.
This module is the ledger's write side; its tables and the queries that read them live in
:mod:`fr_agents.run_layout`, which the viewer reads the ledger with too.

Aborted leaves (the grader or the sandbox failed, docs/DESIGN.md "Infrastructure failures") are
kept in a table of their own, ``episode_aborts``, one row per aborted leaf of every attempt (leaf
NULL when an attempt failed before sampling), written in the same transaction as the episode's
trained leaves. So every trajectory an episode grew has one row, the trained ones are exactly
``episode_leaves``, and an episode whose every attempt aborted is recorded too (aborts only): it is
done, with nothing to train on, and a resumed run does not run it again (:meth:`EpisodeLedger.done`).

It is written right after the tree's durable ``finish``. A crash between the two only means the
episode is re-run on resume: the same seed and weights reproduce the same path, the tree reports
the existing leaf (:class:`~fr_agents.tree.store.DuplicateLeafError`), and the ledger learns it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fr_agents import run_layout
from fr_agents.run_layout import LEDGER_SCHEMA, AbortRow, LedgerRow

if TYPE_CHECKING:
    from trainer.episodes import EpisodeOutcome
    from trainer.schedule import EpisodeSpec


class EpisodeLedger:
    """Thread-safe map episode -> its leaves (leaf, reward, policy tokens, version), durable in SQLite (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(LEDGER_SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """A run directory from before branching holds one leaf per episode in table ``episodes``:
        its rows become branch 0 of ``episode_leaves`` (so such a run still resumes). A ledger
        from before the ``sampled`` column gains it, empty for the rows it holds."""
        cols = [r[1] for r in self._conn.execute("PRAGMA table_info(episode_leaves)")]
        if "sampled" not in cols:
            try:
                self._conn.execute("ALTER TABLE episode_leaves ADD COLUMN sampled INTEGER")
            except sqlite3.OperationalError as e:  # another process (the rollout's) added it first
                if "duplicate column" not in str(e):
                    raise
        old = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'episodes'").fetchone()
        if old:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR IGNORE INTO episode_leaves (episode, branch, batch, leaf, reward, tokens, version) "
                "SELECT episode, 0, batch, leaf, reward, tokens, version FROM episodes"
            )
            self._conn.execute("DROP TABLE episodes")
            self._conn.execute("COMMIT")

    def record(self, episode: int, batch: int, leaf: int, reward: float, tokens: int, version: int) -> None:
        """Record a linear (one-leaf) episode."""
        self.record_episode(episode, batch, [(leaf, reward, tokens)], version)

    def record_episode(self, episode: int, batch: int, leaves: list[tuple[Any, ...]], version: int) -> None:
        """Record all leaves ``(leaf, reward, policy tokens[, sampled tokens[, status, attempt,
        reason]])`` of one episode in one transaction. Sampled tokens: what the engine sampled for
        that branch itself (see :meth:`sampled_tokens`); None when not known. A leaf of status
        ``aborted`` goes to the aborts (leaf -1 or None: the attempt sampled nothing)."""
        self._write([(episode, batch, leaves, version)])

    def _write(self, episodes: list[tuple[int, int, list[tuple[Any, ...]], int]]) -> None:
        """Replace the rows of each ``(episode, batch, leaves, version)``, all in one transaction;
        nothing is written when an episode has no leaf (trained or aborted)."""
        for episode, _, leaves, _ in episodes:
            if not leaves:
                raise ValueError(f"leaves: episode {episode} has no leaf")

        def sampled(x: tuple[Any, ...]) -> int | None:
            return None if len(x) < 4 or x[3] is None else int(x[3])

        def aborted(x: tuple[Any, ...]) -> bool:
            return len(x) > 4 and x[4] == "aborted"

        trained, aborts = [], []
        for episode, batch, leaves, version in episodes:
            kept = [x for x in leaves if not aborted(x)]
            lost = [x for x in leaves if aborted(x)]
            trained += [
                (episode, i, batch, int(x[0]), float(x[1]), int(x[2]), int(version), sampled(x)) for i, x in enumerate(kept)
            ]
            aborts += [
                (episode, n, int(x[5]) if len(x) > 5 and x[5] is not None else 0, batch,
                 None if x[0] is None or int(x[0]) < 0 else int(x[0]), str(x[6]) if len(x) > 6 and x[6] else "unknown",
                 int(x[2]), int(version), sampled(x))
                for n, x in enumerate(lost)
            ]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for table in ("episode_leaves", "episode_aborts"):
                    self._conn.executemany(
                        f"DELETE FROM {table} WHERE episode = ?", [(episode,) for episode, _, _, _ in episodes]
                    )
                self._conn.executemany(
                    "INSERT INTO episode_leaves (episode, branch, batch, leaf, reward, tokens, version, sampled) "
                    "VALUES (?,?,?,?,?,?,?,?)",
                    trained,
                )
                if aborts:
                    self._conn.executemany(
                        "INSERT INTO episode_aborts (episode, n, attempt, batch, leaf, reason, tokens, version, sampled) "
                        "VALUES (?,?,?,?,?,?,?,?,?)",
                        aborts,
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def record_outcomes(self, finished: Iterable[tuple[EpisodeSpec, EpisodeOutcome]]) -> None:
        """Record several ``(spec, outcome)`` pairs in one transaction (one commit instead of one per
        episode): all of them are acknowledged together, or none is and they are re-run on resume."""
        episodes = [
            (
                spec.episode,
                spec.batch,
                [(x.leaf_id, x.reward, x.policy_tokens, x.sampled_tokens) for x in out.leaves]
                + [(x.leaf_id, x.reward, x.policy_tokens, x.sampled_tokens, "aborted", x.attempt, x.reason)
                   for x in getattr(out, "aborted", ())],
                spec.version,
            )
            for spec, out in finished
        ]
        if episodes:
            self._write(episodes)

    def leaves(self, episodes: Iterable[int]) -> dict[int, int]:
        """``{episode: leaf}`` (its first leaf to train on) for those of ``episodes`` that have one
        (:meth:`done` also counts the episodes whose every attempt aborted)."""
        with self._lock:
            return run_layout.first_leaves(self._conn, episodes)

    def done(self, episodes: Iterable[int]) -> set[int]:
        """Those of ``episodes`` that are recorded: with leaves to train on, or with every attempt
        aborted (nothing to train on, not to be run again)."""
        with self._lock:
            return run_layout.done_episodes(self._conn, episodes)

    def aborted_rows(self, batch: int) -> list[AbortRow]:
        """``(episode, attempt, leaf or None, reason)`` of every aborted leaf of batch ``batch``
        (never trained on), by episode, then in the order the attempts made them."""
        with self._lock:
            return run_layout.aborted_rows(self._conn, batch)

    def batch_rows(self, batch: int) -> list[LedgerRow]:
        """``(episode, leaf, reward, tokens, version)`` of batch ``batch``: one row per leaf, by
        episode then branch."""
        with self._lock:
            return run_layout.batch_rows(self._conn, batch)

    def sampled_tokens(self, batch: int) -> int | None:
        """Policy tokens the engine sampled for batch ``batch``: every token of every branch once,
        identical siblings included (the tree stores those once, and each leaf's ``tokens`` count
        a fork's shared part once per leaf), aborted attempts included. None when a row of the
        batch does not know it."""
        with self._lock:
            return run_layout.sampled_tokens(self._conn, batch)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
