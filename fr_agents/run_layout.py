"""The run directory: what ``fr-agents train`` writes into ``RUN_DIR``, and how to read its ledger.

Every name below is declared here and nowhere else; the trainer (which writes these files) and the
viewer (which reads them) both import them from this module, so data still flows one way
(``fr_agents`` never imports ``trainer``)::

    RUN_DIR/
      config.yaml          CONFIG_FILE      the resolved config (names the model, hence the tokenizer)
      metrics.jsonl        METRICS_FILE     one JSON row per learner step, plus eval / warm_start / end events
      curves.png           PLOT_FILE        reward and acceptance against step, redrawn every plot_every steps
      tb/                  TENSORBOARD_DIR  the same rows as TensorBoard events
      store.sqlite         STORE_FILE       the trajectory tree (SQLite, WAL)
      episodes.sqlite      LEDGER_FILE      the episode ledger: which scheduled episode and batch each leaf served
      demos.sqlite         DEMO_STORE       the expert's warm-start episodes (warm_start.demos=expert)
      evals/               EVALS_DIR        held-out and periodic evaluations (samples, during_training.jsonl)
      checkpoints/         CHECKPOINT_DIR   step_NNNNNN/ folders, and LATEST naming the newest complete one
        step_000025/       checkpoint_name  HF weights + tokenizer + trainer_state.pt (STATE_FILE)

The episode ledger. :class:`trainer.ledger.EpisodeLedger` writes it (one transaction per episode);
its tables (:data:`LEDGER_SCHEMA`) and every query that reads them are here, as functions of an
open ``sqlite3`` connection, so the trainer's ledger and the viewer's read-only connection ask the
same questions the same way::

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
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"
TENSORBOARD_DIR = "tb"
STORE_FILE = "store.sqlite"
LEDGER_FILE = "episodes.sqlite"
DEMO_STORE = "demos.sqlite"
EVALS_DIR = "evals"
DURING_TRAINING_FILE = "during_training.jsonl"  # inside EVALS_DIR: one summary row per periodic evaluation
CHECKPOINT_DIR = "checkpoints"
LATEST = "LATEST"  # inside CHECKPOINT_DIR: the name of the newest complete checkpoint
STATE_FILE = "trainer_state.pt"  # inside a checkpoint: what an exact resume needs besides the weights
CHECKPOINT_GLOB = "step_*"


# =========================================================================== checkpoints


def checkpoint_root(run_dir: str | Path) -> Path:
    """``RUN_DIR/checkpoints``."""
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint taken after ``step`` optimizer steps.

    >>> checkpoint_name(25)
    'step_000025'
    """
    return f"step_{step:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (the one ``LATEST`` names, else the newest
    folder holding a :data:`STATE_FILE`), or ``None``."""
    root = checkpoint_root(run_dir)
    pointer = root / LATEST
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / STATE_FILE).exists():
            return path
    done = sorted(p for p in root.glob(CHECKPOINT_GLOB) if (p / STATE_FILE).exists())
    return done[-1] if done else None


# =========================================================================== the episode ledger

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
            rows = conn.execute(f"SELECT episode, batch FROM {table} WHERE leaf = ? ORDER BY episode", (leaf,)).fetchall()
            return [{"episode": int(e), "batch": int(b)} for e, b in rows]
    return []


def first_leaves(conn: sqlite3.Connection, episodes: Iterable[int]) -> dict[int, int]:
    """``{episode: leaf}``: the first leaf (branch 0) to train on, for those of ``episodes`` that have one."""
    eps = list(episodes)
    if not eps:
        return {}
    marks = ",".join("?" * len(eps))
    rows = conn.execute(f"SELECT episode, leaf FROM episode_leaves WHERE branch = 0 AND episode IN ({marks})", eps).fetchall()
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
            "SELECT episode, leaf, reward, tokens, version FROM episode_leaves WHERE batch = ? ORDER BY episode, branch",
            (batch,),
        )
    ]


def sampled_tokens(conn: sqlite3.Connection, batch: int) -> int | None:
    """Policy tokens the engine sampled for batch ``batch``: every token of every branch once,
    identical siblings included, aborted attempts included. None when a row of the batch does
    not know it."""
    n, known, total = conn.execute(
        "SELECT COUNT(*), COUNT(sampled), COALESCE(SUM(sampled), 0) FROM "
        "(SELECT sampled FROM episode_leaves WHERE batch = ? UNION ALL SELECT sampled FROM episode_aborts WHERE batch = ?)",
        (batch, batch),
    ).fetchone()
    return int(total) if n and known == n else None
