"""The episode ledger: which stored leaf holds scheduled episode ``i``.

The trajectory tree stores each distinct sample once, so two episodes that sample bit-identical
tokens (say four GRPO samples all answering ``19``) share one leaf; the learner must still count
that leaf once per episode. The ledger (``RUN_DIR/episodes.sqlite``) maps every finished episode to
its leaf, so batch ``k`` is read back exactly as scheduled, duplicates included.

A branching episode has several leaves: the ledger holds one row per leaf, numbered ``branch``
0, 1, … in the episode's depth-first order, and :meth:`EpisodeLedger.record_episode` writes all of
an episode's rows in one transaction, so an episode is either wholly acknowledged or re-run.
This module owns the ledger: its tables (:data:`LEDGER_SCHEMA`), the queries that read them (functions
of an open ``sqlite3`` connection, so the trainer's :class:`EpisodeLedger` and the viewer's
read-only connection ask the same questions the same way) and the writer.

Aborted leaves (the grader or the sandbox failed, docs/DESIGN.md "Infrastructure failures") are
kept in a table of their own, ``episode_aborts``, one row per aborted leaf of every attempt (leaf
NULL when an attempt failed before sampling), written in the same transaction as the episode's
trained leaves. So every trajectory an episode grew has one row, the trained ones are exactly
``episode_leaves``, and an episode whose every attempt aborted is recorded too (aborts only): it is
done, with nothing to train on, and a resumed run does not run it again (:meth:`EpisodeLedger.done`).

It is written right after the tree's durable ``finish``. A crash between the two only means the
episode is re-run on resume: the same seed and weights reproduce the same path, the tree reports
the existing leaf (:class:`~fr_agents.tree.store.DuplicateLeafError`), and the ledger learns it.

The queries, on any open connection::

    >>> import sqlite3
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(LEDGER_SCHEMA)  # doctest: +ELLIPSIS
    <sqlite3.Cursor object at ...>
    >>> _ = conn.execute("INSERT INTO episode_leaves VALUES (3, 0, 1, 42, 1.0, 7, 0, 7)")
    >>> leaf_episodes(conn, 42)
    [{'episode': 3, 'batch': 1}]
    >>> batch_rows(conn, 1)
    [LedgerRow(episode=3, leaf=42, reward=1.0, tokens=7, version=0)]

A row of batch ``k`` is a :class:`LedgerRow` (fields by name; still a tuple, so
``(3, 42, 1.0, 7, 0)`` compares equal to it); an aborted leaf is an :class:`AbortRow`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS episode_leaves (
    episode INTEGER NOT NULL,
    branch  INTEGER NOT NULL,
    batch   INTEGER NOT NULL,
    leaf    INTEGER NOT NULL,
    reward  REAL NOT NULL,
    tokens  INTEGER NOT NULL,
    version INTEGER NOT NULL,
    sampled INTEGER,
    PRIMARY KEY (episode, branch)
);
CREATE INDEX IF NOT EXISTS episode_leaves_batch ON episode_leaves(batch);
CREATE TABLE IF NOT EXISTS episode_aborts (
    episode INTEGER NOT NULL,
    n       INTEGER NOT NULL,  -- its place among the episode's aborted leaves, attempts in order
    attempt INTEGER NOT NULL,  -- 0: the episode's first run; each retry adds one
    batch   INTEGER NOT NULL,
    leaf    INTEGER,           -- NULL: the attempt failed before it sampled anything (its reset)
    reason  TEXT NOT NULL,     -- InfrastructureFailure.reason
    tokens  INTEGER NOT NULL,
    version INTEGER NOT NULL,
    sampled INTEGER,
    PRIMARY KEY (episode, n)
);
CREATE INDEX IF NOT EXISTS episode_aborts_batch ON episode_aborts(batch);
"""


class LedgerRow(NamedTuple):
    """One leaf to train on of a batch, as ``episode_leaves`` holds it."""

    episode: int  # the scheduled episode that grew the leaf
    leaf: int  # its leaf id in the trajectory tree
    reward: float  # the env's reward
    tokens: int  # policy tokens on the leaf's path (a fork's shared part counted once per leaf)
    version: int  # the weight version the episode started on


class AbortRow(NamedTuple):
    """One aborted leaf of a batch (never trained on), as ``episode_aborts`` holds it."""

    episode: int
    attempt: int  # 0: the episode's first run; each retry adds one
    leaf: int | None  # None: the attempt failed before it sampled anything
    reason: str  # InfrastructureFailure.reason


LEGACY_LEDGER_TABLE = "episodes"  # one row per episode: runs written before branching existed


def leaf_episodes(conn: sqlite3.Connection, leaf: int) -> list[dict[str, int]]:
    """``[{episode, batch}]`` of every scheduled episode that trained on ``leaf``, by episode.

    Reads ``episode_leaves``, or the one-row-per-episode table of a run written before branching
    existed (a read-only reader cannot migrate it); neither table: a ledger not created yet, ``[]``.
    """
    for table in ("episode_leaves", LEGACY_LEDGER_TABLE):
        with contextlib.suppress(sqlite3.OperationalError):
            rows = conn.execute(
                f"SELECT episode, batch FROM {table} WHERE leaf = ? ORDER BY episode", (leaf,)
            ).fetchall()
            return [{"episode": int(e), "batch": int(b)} for e, b in rows]
    return []


def first_leaves(conn: sqlite3.Connection, episodes: Iterable[int]) -> dict[int, int]:
    """``{episode: leaf}``: the first leaf (branch 0) to train on, for those of ``episodes`` that have one."""
    eps = list(episodes)
    if not eps:
        return {}
    marks = ",".join("?" * len(eps))
    rows = conn.execute(
        f"SELECT episode, leaf FROM episode_leaves WHERE branch = 0 AND episode IN ({marks})", eps
    ).fetchall()
    return {int(e): int(leaf) for e, leaf in rows}


def done_episodes(conn: sqlite3.Connection, episodes: Iterable[int]) -> set[int]:
    """Those of ``episodes`` that are recorded: with leaves to train on, or with every attempt
    aborted (nothing to train on, not to be run again)."""
    eps = list(episodes)
    if not eps:
        return set()
    marks = ",".join("?" * len(eps))
    rows = conn.execute(
        f"SELECT episode FROM episode_leaves WHERE branch = 0 AND episode IN ({marks}) "
        f"UNION SELECT episode FROM episode_aborts WHERE n = 0 AND episode IN ({marks})",
        [*eps, *eps],
    ).fetchall()
    return {int(e) for (e,) in rows}


def aborted_rows(conn: sqlite3.Connection, batch: int) -> list[AbortRow]:
    """``(episode, attempt, leaf or None, reason)`` of every aborted leaf of batch ``batch``
    (never trained on), by episode, then in the order the attempts made them."""
    return [
        AbortRow(int(e), int(a), None if lf is None else int(lf), str(r))
        for e, a, lf, r in conn.execute(
            "SELECT episode, attempt, leaf, reason FROM episode_aborts WHERE batch = ? ORDER BY episode, n",
            (batch,),
        )
    ]


def batch_rows(conn: sqlite3.Connection, batch: int) -> list[LedgerRow]:
    """``(episode, leaf, reward, tokens, version)`` of batch ``batch``: one row per leaf, by
    episode then branch."""
    return [
        LedgerRow(int(e), int(lf), float(r), int(t), int(v))
        for e, lf, r, t, v in conn.execute(
            "SELECT episode, leaf, reward, tokens, version FROM episode_leaves "
            "WHERE batch = ? ORDER BY episode, branch",
            (batch,),
        )
    ]


def sampled_tokens(conn: sqlite3.Connection, batch: int) -> int | None:
    """Policy tokens the engine sampled for batch ``batch``: every token of every branch once,
    identical siblings included, aborted attempts included. None when a row of the batch does
    not know it."""
    n, known, total = conn.execute(
        "SELECT COUNT(*), COUNT(sampled), COALESCE(SUM(sampled), 0) FROM (SELECT sampled FROM "
        "episode_leaves WHERE batch = ? UNION ALL SELECT sampled FROM episode_aborts WHERE batch = ?)",
        (batch, batch),
    ).fetchone()
    return int(total) if n and known == n else None


class FinishedLeaf(Protocol):
    """What the ledger reads of one leaf of a finished episode (``trainer.episodes.LeafOutcome``)."""

    leaf_id: int
    reward: float
    policy_tokens: int
    sampled_tokens: int | None
    attempt: int
    reason: str | None


class FinishedSpec(Protocol):
    """What the ledger reads of a scheduled episode (``trainer.batches.EpisodeSpec``)."""

    episode: int
    batch: int
    version: int


class FinishedOutcome(Protocol):
    """What the ledger reads of a finished episode (``trainer.episodes.EpisodeOutcome``)."""

    leaves: Sequence[FinishedLeaf]
    aborted: Sequence[FinishedLeaf]


class EpisodeLedger:
    """Thread-safe map episode -> its leaves (leaf, reward, policy tokens, version), durable in
    SQLite (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(self.path), isolation_level=None, check_same_thread=False, timeout=60
        )
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
        old = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'episodes'"
        ).fetchone()
        if old:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR IGNORE INTO episode_leaves (episode, branch, batch, leaf, reward, tokens, "
                "version) SELECT episode, 0, batch, leaf, reward, tokens, version FROM episodes"
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
                (episode, i, batch, int(x[0]), float(x[1]), int(x[2]), int(version), sampled(x))
                for i, x in enumerate(kept)
            ]
            aborts += [
                (
                    episode,
                    n,
                    int(x[5]) if len(x) > 5 and x[5] is not None else 0,
                    batch,
                    None if x[0] is None or int(x[0]) < 0 else int(x[0]),
                    str(x[6]) if len(x) > 6 and x[6] else "unknown",
                    int(x[2]),
                    int(version),
                    sampled(x),
                )
                for n, x in enumerate(lost)
            ]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for table in ("episode_leaves", "episode_aborts"):
                    self._conn.executemany(
                        f"DELETE FROM {table} WHERE episode = ?",
                        [(episode,) for episode, _, _, _ in episodes],
                    )
                self._conn.executemany(
                    "INSERT INTO episode_leaves (episode, branch, batch, leaf, "
                    "reward, tokens, version, sampled) VALUES (?,?,?,?,?,?,?,?)",
                    trained,
                )
                if aborts:
                    self._conn.executemany(
                        "INSERT INTO episode_aborts (episode, n, attempt, batch, leaf, "
                        "reason, tokens, version, sampled) VALUES (?,?,?,?,?,?,?,?,?)",
                        aborts,
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def record_outcomes(self, finished: Iterable[tuple[FinishedSpec, FinishedOutcome]]) -> None:
        """Record several ``(spec, outcome)`` pairs (the trainer's ``EpisodeSpec`` and ``EpisodeOutcome``)
        in one transaction (one commit instead of one per
        episode): all of them are acknowledged together, or none is and they are re-run on resume."""
        episodes = [
            (
                spec.episode,
                spec.batch,
                [(x.leaf_id, x.reward, x.policy_tokens, x.sampled_tokens) for x in out.leaves]
                + [
                    (x.leaf_id, x.reward, x.policy_tokens, x.sampled_tokens, "aborted", x.attempt, x.reason)
                    for x in out.aborted
                ],
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
            return first_leaves(self._conn, episodes)

    def done(self, episodes: Iterable[int]) -> set[int]:
        """Those of ``episodes`` that are recorded: with leaves to train on, or with every attempt
        aborted (nothing to train on, not to be run again)."""
        with self._lock:
            return done_episodes(self._conn, episodes)

    def aborted_rows(self, batch: int) -> list[AbortRow]:
        """``(episode, attempt, leaf or None, reason)`` of every aborted leaf of batch ``batch``
        (never trained on), by episode, then in the order the attempts made them."""
        with self._lock:
            return aborted_rows(self._conn, batch)

    def batch_rows(self, batch: int) -> list[LedgerRow]:
        """``(episode, leaf, reward, tokens, version)`` of batch ``batch``: one row per leaf, by
        episode then branch."""
        with self._lock:
            return batch_rows(self._conn, batch)

    def sampled_tokens(self, batch: int) -> int | None:
        """Policy tokens the engine sampled for batch ``batch``: every token of every branch once,
        identical siblings included (the tree stores those once, and each leaf's ``tokens`` count
        a fork's shared part once per leaf), aborted attempts included. None when a row of the
        batch does not know it."""
        with self._lock:
            return sampled_tokens(self._conn, batch)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
