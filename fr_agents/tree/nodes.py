"""The tree's SQLite database and its ``nodes`` rows: the database (schema, connections,
transactions), the token segments a row holds, placing one with prefix sharing, reading paths back
as trajectories.

:class:`~fr_agents.tree.store.TrajectoryTree` is the front door (validation, transactions, the
leaves and their consumption); this module is what its methods do with node rows inside one
transaction ``c`` (a ``sqlite3.Connection`` already in ``BEGIN``, see :class:`Database` below):

* :func:`insert_node` writes one row (a segment's blobs plus where it sits);
* :func:`descend` places a new segment below a parent, sharing every common prefix: it walks down
  the children that start with the same *sample* (:func:`common_prefix`),
  splits a child where the match ends inside it (the child keeps its id and its suffix, a new head
  node takes the shared part) and stores only the unshared rest as a new open tip;
* :func:`path_rows` reads one node's root-to-node path (a recursive walk up the ``parent`` links);
* :func:`read_trajectories` reads many leaves' paths with two queries per chunk of leaves and
  joins each path's segments into a :class:`Trajectory`, decoding a
  node that several paths share once.

Rows come back as :class:`NodeRow` (the columns :data:`NODE_COLS` selects, blobs undecoded).

**Token segments**: the unit a tree node stores, with validation and the sharing rule. A segment is a run of
tokens appended in one call. Every token carries four facts: its id, the behaviour log-prob (policy tokens
only; 0.0 elsewhere), the policy mask and the policy version (``-1`` for prompt/environment tokens). A node
stores one version scalar; the per-token version is ``version`` where the mask is True and ``-1`` elsewhere,
so four columns cost 9 bytes a token (int32 id + float32 log-prob + one mask byte).

Two tokens are *the same sample* when id, mask, log-prob bits and effective version all agree.
The tree shares a prefix only as far as that holds (:func:`common_prefix`): identical tokens
with different log-probs or versions are different samples and are never merged.

``Trajectory``: one root-to-leaf path of the tree, as :func:`read_trajectories` reads it and the
batch builders (:mod:`fr_agents.tree.batch`) pad and pack it.

**The database** (:class:`Database`): schema, connections, transactions. One schema serves both modes.
``TrajectoryTree()`` keeps it in a private ``:memory:`` database behind one lock;
``TrajectoryTree.open(path)`` uses a file in WAL mode, which lets many writer processes and a reader work at
once:

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
import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

NODE_COLS = "id, parent, root, offset, n, tokens, logprobs, mask, version, created"


class NodeRow(NamedTuple):
    """One ``nodes`` row as :data:`NODE_COLS` selects it (blobs undecoded)."""

    id: int
    parent: int | None
    root: int
    offset: int
    n: int
    tokens: bytes
    logprobs: bytes | None
    mask: bytes
    version: int
    created: int

    @property
    def segment(self) -> Segment:
        """The row's blobs decoded into a :class:`~fr_agents.tree.nodes.Segment`."""
        return Segment.from_blobs(self.tokens, self.logprobs, self.mask, self.version)


def insert_node(
    c: sqlite3.Connection,
    parent: int | None,
    root: int,
    offset: int,
    seg: Segment,
    created: int,
    *,
    root_key: int | None = None,
    meta: str | None = None,
    tip: int = 0,
) -> int:
    """Write ``seg`` as a new node under ``parent`` (``None`` for a root) at ``offset`` tokens into
    ``root``'s paths; returns its id. ``root_key`` and ``meta`` are a root's prompt hash and
    metadata; ``tip=1`` marks an open tip (a node an episode may still extend)."""
    tokens, logprobs, mask = seg.to_blobs()
    cur = c.execute(
        "INSERT INTO nodes(parent, root, offset, n, first_tok, tokens, logprobs, mask, version, created,"
        " root_key, meta, tip) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            parent,
            root,
            offset,
            len(seg),
            int(seg.tokens[0]),
            tokens,
            logprobs,
            mask,
            seg.version,
            created,
            root_key,
            meta,
            tip,
        ),
    )
    return int(cur.lastrowid)  # type: ignore[arg-type]


def descend(c: sqlite3.Connection, parent: int, root: int, offset: int, seg: Segment) -> tuple[int, bool]:
    """Place ``seg`` below ``parent`` sharing every common prefix.

    Returns the end node and whether it is a new (open-tip) node holding the unshared rest."""
    while True:
        match, lcp = None, 0
        for found in c.execute(
            f"SELECT {NODE_COLS} FROM nodes WHERE parent = ? AND first_tok = ?", (parent, int(seg.tokens[0]))
        ).fetchall():
            r = NodeRow(*found)
            child = r.segment
            k = common_prefix(seg, child)
            if k > 0:  # siblings never share a first sample, so at most one child matches
                match, lcp, child_seg = r, k, child
                break
        if match is None:
            return insert_node(c, parent, root, offset, seg, bump(c, "seq"), tip=1), True
        child_id, child_n = match.id, match.n
        if lcp < child_n:  # split: a new node takes the shared head; the child keeps its id
            head = insert_node(c, parent, root, offset, child_seg.slice(0, lcp), match.created)
            tail = child_seg.slice(lcp)
            t_tokens, t_lp, t_mask = tail.to_blobs()
            c.execute(
                "UPDATE nodes SET parent=?, offset=?, n=?, first_tok=?, "
                "tokens=?, logprobs=?, mask=?, version=? WHERE id=?",
                (
                    head,
                    offset + lcp,
                    len(tail),
                    int(tail.tokens[0]),
                    t_tokens,
                    t_lp,
                    t_mask,
                    tail.version,
                    child_id,
                ),
            )
            child_id = head
        if lcp == len(seg):
            return child_id, False
        parent, offset, seg = child_id, offset + lcp, seg.slice(lcp)


def path_rows(c: sqlite3.Connection, node: int) -> list[NodeRow]:
    """The rows of ``node``'s path, root first (empty when ``node`` is unknown)."""
    rows = c.execute(
        f"""
        WITH RECURSIVE up(id) AS (
            SELECT ? UNION ALL SELECT nodes.parent FROM nodes JOIN up ON nodes.id = up.id
            WHERE nodes.parent IS NOT NULL
        )
        SELECT {NODE_COLS} FROM nodes WHERE id IN (SELECT id FROM up) ORDER BY offset
        """,
        (node,),
    ).fetchall()
    return [NodeRow(*r) for r in rows]


_READ_CHUNK = 500  # leaves per query (SQLite's bound on a statement's parameters)


def read_trajectories(c: sqlite3.Connection, leaves: Sequence[int]) -> list[Trajectory]:
    """The trajectories of ``leaves`` (in that order, repeats allowed), read with two queries per
    chunk of leaves: their ``leaves`` rows, and every node on their paths (one recursive walk up
    from all of them). A node shared by several paths is decoded once."""
    unique = list(dict.fromkeys(leaves))
    meta: dict[int, tuple[Any, ...]] = {}
    paths: dict[int, list[NodeRow]] = {}
    for i in range(0, len(unique), _READ_CHUNK):
        part = unique[i : i + _READ_CHUNK]
        marks = ",".join("?" * len(part))
        for row in c.execute(
            f"SELECT id, root, reward, partial_score, status, info FROM leaves WHERE id IN ({marks})", part
        ):
            meta[int(row[0])] = row[1:]
        for row in c.execute(
            f"""
            WITH RECURSIVE up(leaf, id) AS (
                SELECT id, id FROM leaves WHERE id IN ({marks})
                UNION ALL SELECT up.leaf, nodes.parent FROM nodes JOIN up ON nodes.id = up.id
                WHERE nodes.parent IS NOT NULL
            )
            SELECT up.leaf, {", ".join("nodes." + col for col in NODE_COLS.split(", "))}
            FROM up JOIN nodes ON nodes.id = up.id ORDER BY up.leaf, nodes.offset
            """,
            part,
        ):
            paths.setdefault(int(row[0]), []).append(NodeRow(*row[1:]))
    for leaf in unique:
        if leaf not in meta:
            raise ValueError(f"leaf: {leaf} is not a finished leaf")
    segments: dict[int, Segment] = {}
    built = {leaf: _trajectory(leaf, meta[leaf], paths[leaf], segments) for leaf in unique}
    return [built[leaf] for leaf in leaves]


def _trajectory(
    leaf: int, meta: tuple[Any, ...], rows: list[NodeRow], segments: dict[int, Segment]
) -> Trajectory:
    """One leaf's :class:`Trajectory` from its ``leaves`` columns ``meta`` and its path's ``rows``
    (root first); ``segments`` caches the decoded segments by node id across the leaves of a read."""
    root, reward, partial_score, status, info = meta
    for r in rows:
        if r.id not in segments:
            segments[r.id] = r.segment
    segs = [segments[r.id] for r in rows]
    mask = np.concatenate([s.mask for s in segs])
    return Trajectory(
        leaf_id=leaf,
        root_id=int(root),
        token_ids=np.concatenate([s.tokens for s in segs]).tolist(),
        logprobs=np.concatenate([s.logprobs for s in segs]).astype(np.float64).tolist(),
        policy_mask=mask.tolist(),
        versions=np.concatenate([s.versions for s in segs]).tolist(),
        reward=float(reward),
        partial_score=None if partial_score is None else float(partial_score),
        status=str(status),
        info=json.loads(info) if info else {},
        prompt_len=len(segs[0]),
        path=[r.id for r in rows],
        offsets=[r.offset for r in rows],
    )


# =========================================================================== segment

_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class Segment:
    """Validated token run: ``tokens`` int32, ``logprobs`` float32, ``mask`` bool, one ``version``."""

    tokens: np.ndarray
    logprobs: np.ndarray
    mask: np.ndarray
    version: int

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def versions(self) -> np.ndarray:
        """Per-token policy version: ``version`` on policy tokens, ``-1`` elsewhere."""
        return np.where(self.mask, np.int64(self.version), np.int64(-1))

    def slice(self, start: int, stop: int | None = None) -> Segment:
        """The sub-run ``[start:stop]``; its version collapses to -1 when it holds no policy token."""
        mask = self.mask[start:stop]
        return Segment(
            self.tokens[start:stop],
            self.logprobs[start:stop],
            mask,
            self.version if bool(mask.any()) else -1,
        )

    # ------------------------------------------------------------------ (de)serialisation
    def to_blobs(self) -> tuple[bytes, bytes, bytes]:
        """Little-endian bytes for the three token columns (what SQLite stores)."""
        return (
            self.tokens.astype("<i4", copy=False).tobytes(),
            self.logprobs.astype("<f4", copy=False).tobytes(),
            self.mask.astype(np.uint8).tobytes(),
        )

    @staticmethod
    def from_blobs(tokens: bytes, logprobs: bytes, mask: bytes, version: int) -> Segment:
        """Inverse of :meth:`to_blobs`."""
        return Segment(
            np.frombuffer(tokens, dtype="<i4"),
            np.frombuffer(logprobs, dtype="<f4"),
            np.frombuffer(mask, dtype=np.uint8).astype(bool),
            int(version),
        )


def make_segment(
    token_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    policy_mask: Sequence[bool] | bool,
    version: int,
) -> Segment:
    """Validate one append's arguments and normalise them into a :class:`Segment`.

    ``policy_mask`` may be one bool for the whole run. ``logprobs`` may be None only when no
    token is a policy token. Log-probs of non-policy tokens are ignored (stored as 0.0).
    Raises ``ValueError`` naming the offending field; nothing has been written at that point.
    """
    tokens = _token_array(token_ids, "token_ids")
    n = tokens.shape[0]
    if n == 0:
        raise ValueError("token_ids: must hold at least one token")
    if isinstance(policy_mask, (bool, np.bool_)):
        mask = np.full(n, bool(policy_mask))
    else:
        mask = np.asarray([bool(m) for m in policy_mask], dtype=bool)
        if mask.shape[0] != n:
            raise ValueError(f"policy_mask: length {mask.shape[0]} != len(token_ids) {n}")
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise ValueError(f"version: must be an int, got {version!r}")
    version = int(version)
    if mask.any() and version < 0:
        raise ValueError(f"version: policy tokens need a version >= 0, got {version}")
    if logprobs is None:
        if mask.any():
            raise ValueError("logprobs: required when policy_mask marks policy tokens")
        lp = np.zeros(n, dtype=np.float32)
    else:
        lp = np.asarray(list(logprobs), dtype=np.float64)
        if lp.shape != (n,):
            raise ValueError(f"logprobs: length {lp.shape[0] if lp.ndim else 0} != len(token_ids) {n}")
        pol = lp[mask]
        if not np.all(np.isfinite(pol)):
            raise ValueError("logprobs: policy tokens need finite log-probs")
        if np.any(pol > 0):
            bad = int(np.flatnonzero(mask)[np.argmax(pol > 0)])
            raise ValueError(f"logprobs: positive log-prob {lp[bad]} on policy token at index {bad}")
        # Non-policy log-probs are not samples: store 0.0; "+ 0.0" turns -0.0 into 0.0 so the
        # bitwise sample identity below never depends on the sign of zero.
        lp = np.where(mask, lp, 0.0).astype(np.float32) + np.float32(0.0)
    return Segment(tokens, lp, mask, version if mask.any() else -1)


def _token_array(token_ids: Sequence[int], field: str) -> np.ndarray:
    try:
        arr = np.asarray(list(token_ids))
    except TypeError as e:
        raise ValueError(f"{field}: expected a sequence of ints ({e})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{field}: expected a flat sequence of ints")
    if arr.min() < 0 or arr.max() > _MAX_TOKEN_ID:
        raise ValueError(f"{field}: token ids must lie in [0, 2**31)")
    return arr.astype(np.int32)


def prompt_tokens(token_ids: Sequence[int]) -> np.ndarray:
    """Validate root prompt ids (non-empty ints) and return them as int32."""
    tokens = _token_array(token_ids, "prompt_token_ids")
    if tokens.shape[0] == 0:
        raise ValueError("prompt_token_ids: must hold at least one token")
    return tokens


def common_prefix(a: Segment, b: Segment) -> int:
    """Number of leading tokens that are the same sample in ``a`` and ``b`` (see module doc)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    same = (
        (a.tokens[:n] == b.tokens[:n])
        & (a.mask[:n] == b.mask[:n])
        & (a.logprobs[:n].view(np.int32) == b.logprobs[:n].view(np.int32))
        & (a.versions[:n] == b.versions[:n])
    )
    if same.all():
        return n
    return int(np.argmin(same))


def check_reward(value: float, field: str, *, unit: bool = False) -> float:
    """A finite float (in [0, 1] when ``unit``); ValueError naming ``field`` otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{field}: must be finite, got {x}")
    if unit and not 0.0 <= x <= 1.0:
        raise ValueError(f"{field}: must lie in [0, 1], got {x}")
    return x


# =========================================================================== trajectory

# finished: the env ended it; truncated: cut by a budget or the env (it may carry a partial score);
# aborted: its grading could not happen (fr_agents.errors.InfrastructureFailure): stored as sampled,
# never trained on (docs/DESIGN.md, "Infrastructure failures")
STATUSES = ("finished", "truncated", "aborted")
# env: the env's reward; partial: a cut leaf's partial score on its whole row; progress: that score
# on the replies up to the one that reached its best only (Trajectory.credit_end)
REWARD_MODES = ("env", "partial", "progress")


@dataclass
class Trajectory:
    """One root-to-leaf path: per-token columns plus the leaf's outcome."""

    leaf_id: int
    root_id: int
    token_ids: list[int]
    logprobs: list[float]
    policy_mask: list[bool]
    versions: list[int]
    reward: float
    partial_score: float | None
    status: str
    info: dict[str, Any]
    prompt_len: int
    path: list[int] = field(default_factory=list)  # node ids, root first
    offsets: list[int] = field(default_factory=list)  # start of each path node on the path

    def learner_reward(self, mode: str = "env") -> float:
        """The reward the learner sees: the env reward, or (``"partial"``, ``"progress"``) the
        partial score of an unfinished (truncated/aborted) leaf when it has one."""
        if mode not in REWARD_MODES:
            raise ValueError(f"reward: must be one of {REWARD_MODES}, got {mode!r}")
        if mode != "env" and self.cut_with_score:
            return float(self.partial_score)  # type: ignore[arg-type]
        return float(self.reward)

    def credit_end(self, mode: str = "env") -> int:
        """The token index where this row's reward stops paying: ``len(token_ids)`` (every token)
        except under ``"progress"`` for a cut leaf paid its partial score whose steps said when the
        score first reached its best (``info["progress_turn"]``, :mod:`fr_agents.rollout.episode`):
        then the first token of the reply after that one. The replies from there on made no progress;
        they earn 0 where the ones before earn the score (a loop after a sub-goal is not paid
        as the sub-goal was)."""
        if mode not in REWARD_MODES:
            raise ValueError(f"reward: must be one of {REWARD_MODES}, got {mode!r}")
        turn = self.info.get("progress_turn")
        n = len(self.token_ids)
        if mode != "progress" or not self.cut_with_score or not isinstance(turn, int):
            return n
        replies = 0  # the replies are the runs of policy tokens, observations between them
        for i, (policy, before) in enumerate(zip(self.policy_mask, [False, *self.policy_mask], strict=False)):
            if policy and not before:
                if replies == turn:
                    return i
                replies += 1
        return n

    @property
    def cut_with_score(self) -> bool:
        """Unfinished (truncated/aborted) with a partial score: what ``partial`` and ``progress`` pay."""
        return self.status != "finished" and self.partial_score is not None

    @property
    def failed(self) -> bool:
        """A failure: the episode did not finish normally, or its env reward is <= 0."""
        return self.status != "finished" or self.reward <= 0


# ================================================================== the database: connections, transactions

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
