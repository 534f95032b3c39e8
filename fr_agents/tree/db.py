"""SQLite plumbing for the trajectory tree: schema, connections, transactions.

One schema serves both modes. ``TrajectoryTree()`` keeps it in a private ``:memory:`` database
behind one lock; ``TrajectoryTree.open(path)`` uses a file in WAL mode, which lets many writer
processes and a reader work at once:

* every thread (and every process after ``fork``) gets its own connection, because a sqlite3
  connection must not be shared across threads or a fork;
* every write is one ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock (waiting
  up to ``busy_timeout``) instead of failing, and readers never block writers (WAL);
* appends commit with ``synchronous=NORMAL`` (survives a killed process, no fsync); ``finish``
  commits the same way and then calls :meth:`Database.sync`, which fsyncs the WAL file and with it
  every earlier append, so a finished trajectory also survives a power loss once ``finish`` has
  returned. That is what ``synchronous=FULL`` does at each commit, but as a *group sync*: one
  ``fsync`` started after your commit covers you, so threads that finish at the same time share
  one ``fsync`` instead of queueing for one each (an fsync costs milliseconds; a commit, tens of
  microseconds).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id        INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused, even after compaction
    parent    INTEGER,                -- NULL for roots
    root      INTEGER NOT NULL,       -- the root this node hangs under (itself for roots)
    offset    INTEGER NOT NULL,       -- tokens on the path before this node
    n         INTEGER NOT NULL,       -- tokens in this node
    first_tok INTEGER NOT NULL,
    tokens    BLOB NOT NULL,          -- int32 little-endian
    logprobs  BLOB NOT NULL,          -- float32 little-endian, 0.0 on non-policy tokens
    mask      BLOB NOT NULL,          -- one byte per token, 1 = policy token
    version   INTEGER NOT NULL,       -- policy version of the policy tokens, -1 when none
    created   INTEGER NOT NULL,       -- creation sequence number (keeps age across splits)
    tip       INTEGER NOT NULL DEFAULT 0, -- 1 = returned by append, not yet extended/finished
    root_key  INTEGER,                -- roots only: 64-bit hash of the prompt (tokens are compared too)
    meta      TEXT                    -- roots only: JSON given to add_root
);
CREATE INDEX IF NOT EXISTS nodes_child ON nodes(parent, first_tok);
CREATE INDEX IF NOT EXISTS nodes_root_key ON nodes(root_key) WHERE root_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS nodes_tip ON nodes(tip) WHERE tip = 1;

CREATE TABLE IF NOT EXISTS leaves (
    id            INTEGER PRIMARY KEY,  -- = the finished node's id
    seq           INTEGER NOT NULL UNIQUE, -- finish order
    root          INTEGER NOT NULL,
    length        INTEGER NOT NULL,     -- tokens on the root-to-leaf path
    start_seq     INTEGER NOT NULL,     -- age of the episode: creation seq of its first non-root node
    min_version   INTEGER NOT NULL,     -- oldest policy version on the path (-1: no policy token)
    max_version   INTEGER NOT NULL,
    reward        REAL NOT NULL,
    partial_score REAL,
    status        TEXT NOT NULL,
    info          TEXT,
    action_key    INTEGER,              -- 64-bit digest of normalised actions (redundancy pruning)
    obs_key       INTEGER,              -- 64-bit digest of observations, NULL when the path has none
    state         INTEGER NOT NULL DEFAULT 0, -- 0 available, 1 consumed, 2 stale, 3 pruned
    consumed_seq  INTEGER               -- consumption batch number (the store cursor)
);
CREATE INDEX IF NOT EXISTS leaves_avail ON leaves(state, start_seq, seq);
CREATE INDEX IF NOT EXISTS leaves_root ON leaves(root, seq);

CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

COUNTERS = ("seq", "cursor", "pruned", "stale", "compacted_nodes", "compacted_leaves", "schema_version")


class Database:
    """Connections and transactions for one store (file path or ``None`` for memory)."""

    def __init__(self, path: str | None, *, busy_timeout_ms: int = 60_000) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        # Memory mode has exactly one connection; the lock makes it safe across threads.
        # File mode relies on SQLite's own locking; the RLock only orders this process's threads
        # around the shared connection list used by close().
        self._lock = threading.RLock()
        self._memory: sqlite3.Connection | None = None
        self._all: list[sqlite3.Connection] = []
        self.closed = False
        # group sync: commits registered so far, commits known durable, one fsync at a time
        self._sync_state = threading.Condition()
        self._sync_flush = threading.Lock()
        self._committed = 0
        self._durable = 0
        self.fsyncs = 0  # fsyncs done by sync() (a counter for tests and benchmarks)
        self._init_schema()

    # ------------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        target = self.path if self.path is not None else ":memory:"
        conn = sqlite3.connect(target, isolation_level=None, timeout=self.busy_timeout_ms / 1e3)
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        if self.path is not None:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OSError(f"path: could not switch {self.path} to WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (created on first use, recreated after a fork)."""
        if self.closed:
            raise RuntimeError("the trajectory tree is closed")
        if self.path is None:
            if self._memory is None:
                self._memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                self._all.append(self._memory)
            return self._memory
        pid = os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != pid:
            conn = self._connect()
            self._local.conn, self._local.pid = conn, pid
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this object opened (in this process)."""
        with self._lock:
            for conn in self._all:
                # a connection made by another thread refuses; it closes when collected
                with contextlib.suppress(sqlite3.ProgrammingError):
                    conn.close()
            self._all.clear()
            self._memory = None
            self.closed = True

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def write(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; rolled back on any exception.

        ``durable=True`` returns only after the commit is on disk (a group :meth:`sync` of the WAL
        after the commit, which is what ``synchronous=FULL`` would do at the commit itself).
        Inside :meth:`group` on this thread it is a savepoint of the group's transaction instead:
        rolled back alone on an exception, committed (and, when durable, synced) with the group.
        """
        group = getattr(self._local, "group", None)
        if group is not None:
            c = self.conn()
            c.execute("SAVEPOINT w")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK TO w")
                c.execute("RELEASE w")
                raise
            c.execute("RELEASE w")
            group["durable"] = group["durable"] or durable
            return
        with self._lock if self.path is None else _nullctx():
            c = self.conn()
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")
        if durable:
            self.sync()

    @contextmanager
    def group(self) -> Iterator[None]:
        """Group commit: the writes this thread makes inside the block share one transaction.

        Each :meth:`write` inside is a savepoint, so a write that raises is undone alone and the
        others stand; all of them commit together when the block ends (or none, when the commit
        itself fails). A durable write inside makes the block sync once after that commit. A
        writer that takes queued writes in runs (the rollout's tree writer) commits, and writes
        WAL pages, once per run instead of once per write.
        """
        with self._lock if self.path is None else _nullctx():
            c = self.conn()
            c.execute("BEGIN IMMEDIATE")
            state = self._local.group = {"durable": False}
            try:
                yield
            except BaseException:
                self._local.group = None
                c.execute("ROLLBACK")
                raise
            self._local.group = None
            c.execute("COMMIT")
        if state["durable"]:
            self.sync()

    def sync(self) -> None:
        """Make every transaction this process committed before the call durable (fsync of the WAL).

        Group sync: a caller registers its commit, then either finds it already covered by an
        fsync that started after it, or becomes the one thread that fsyncs for everybody
        registered so far. A memory database has nothing to sync.
        """
        if self.path is None:
            return
        with self._sync_state:
            self._committed += 1
            mine = self._committed
        with self._sync_flush:
            with self._sync_state:
                if self._durable >= mine:
                    return
                target = self._committed
            self._fsync_wal()
            with self._sync_state:
                self._durable = max(self._durable, target)
                self.fsyncs += 1

    def _fsync_wal(self) -> None:
        assert self.path is not None
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY)
        except FileNotFoundError:  # no WAL (checkpointed and removed): the data is in the database file
            fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot while other processes write."""
        with self._lock if self.path is None else _nullctx():
            c = self.conn()
            c.execute("BEGIN")
            try:
                yield c
            finally:
                c.execute("COMMIT")

    # ------------------------------------------------------------------ schema and counters
    def _init_schema(self) -> None:
        with self.write() as c:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            for name in COUNTERS:
                c.execute("INSERT OR IGNORE INTO counters(name, value) VALUES (?, 0)", (name,))
            found = c.execute("SELECT value FROM counters WHERE name='schema_version'").fetchone()[0]
            if found == 0:
                c.execute("UPDATE counters SET value=? WHERE name='schema_version'", (SCHEMA_VERSION,))
            elif found != SCHEMA_VERSION:
                raise ValueError(f"path: store schema version {found} is not {SCHEMA_VERSION}")


def bump(c: sqlite3.Connection, name: str, by: int = 1) -> int:
    """Add ``by`` to counter ``name`` inside the caller's transaction; returns the new value."""
    return int(
        c.execute(
            "UPDATE counters SET value = value + ? WHERE name = ? RETURNING value", (by, name)
        ).fetchone()[0]
    )


def counter(c: sqlite3.Connection, name: str) -> int:
    return int(c.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0])


@contextmanager
def _nullctx() -> Iterator[None]:
    yield
