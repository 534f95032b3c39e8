"""``TrajectoryTree``: the durable, prefix-sharing radix tree of token segments.

Rollout workers write into it (``add_root`` → ``append``… → ``finish``). The training loop reads
the ``trajectories`` of the leaves a batch names (``trainer/batches.py`` builds the learner's
tensors from them) and marks trained batches consumed (``mark_consumed_batches``, a transaction
for several batches: ``trainer/batches.py``). ``export_flat`` / ``export_packed`` build the same
tensors straight from the store, for tools and tests. A root is a prompt (identical prompts
share one root); a node is a token segment; a *leaf* is a finished node, and its root-to-leaf
path is one trajectory with one reward. Leaf ids are node ids.

Sharing. ``append(parent, tokens, …)`` walks the children of ``parent``: where an existing child
starts with the same *sample* (same ids, mask, log-prob bits and version, see
:mod:`fr_agents.tree.nodes`) the common prefix is shared, splitting the child when the match
ends inside it (the child keeps its id and suffix, so ids held by other workers stay valid).
Forking is just a second ``append`` under the same node. Because identical samples are stored
once, a worker that reproduces an already finished path bit for bit gets
:class:`DuplicateLeafError` (a ``ValueError``) from ``finish``; it carries the existing leaf id.

Storage is SQLite (:class:`~fr_agents.tree.nodes.Database`): a private in-memory database for
``TrajectoryTree()``, a WAL file for ``TrajectoryTree.open(path)``. Every public method is one
transaction, so concurrent rollout threads/processes and a learner thread/process may share a
file; bad input raises ``ValueError`` naming the field before anything is written. What a method
does with the ``nodes`` rows inside its transaction (placing a segment, reading paths back) lives
in :mod:`fr_agents.tree.nodes`; this module keeps the contract, the checks and the leaves' states.

Consumption (the learner's cursor). ``mark_consumed`` durably marks a batch's leaves consumed
and tags them with a batch number. ``cursor()`` is the last batch number: store it in a
checkpoint; ``rewind(cursor)`` after a resume makes leaves consumed after that checkpoint
available again.

Two batch paths, one of them the trainer's (docs/DESIGN.md "The batch path"): the training loop
decides *which* leaves form batch ``k`` outside the tree (``EpisodeSchedule`` + ``EpisodeLedger``,
so batches do not depend on thread timing) and only exports and marks them here. The *store
tools* ``take_batch`` (next ``B`` unconsumed leaves, staleness filter, redundancy pruning),
``prune``, ``compact``, ``unconsumed_count`` and ``oldest_unconsumed_version`` serve consumers
without a schedule (benchmarks, tools reading a store a rollout wrote); the trainer does not call
them.

**Redundancy pruning** (:func:`prune_redundant`, :func:`keep_per_tree`): drop sibling trajectories
that teach nothing new. Two finished leaves under the same root (one GRPO group) are *redundant* when

* their **actions** are identical after normalisation: the sequence of policy-token runs, each
  passed through ``normalize_action`` (default: the token ids themselves; pass e.g.
  ``lambda ids: " ".join(tok.decode(ids).split()).lower()`` to ignore spacing and case), or
* their **observation sequences** are identical: the environment-token runs that sit *between*
  two actions. Paths without such a run (single-turn tasks, or only a trailing chat-template
  suffix) have no observation key and are never pruned on observations, so a plain math group
  is never collapsed to one sample.

Keys are digests computed when ``finish`` runs (by the writer, with its tree's normaliser) and
stored in the leaf row; pruning itself is one SQL statement. Within a group the oldest leaf of
each class survives; only leaves not yet consumed are ever pruned. Pruned leaves get state 3 and
are counted in ``stats()["pruned"]``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fr_agents.tree.nodes import (
    NODE_COLS,
    REWARD_MODES,
    STATUSES,
    Database,
    NodeRow,
    Segment,
    Trajectory,
    bump,
    check_reward,
    counter,
    descend,
    insert_node,
    make_segment,
    path_rows,
    prompt_tokens,
    read_trajectories,
)

if TYPE_CHECKING:
    from fr_agents.tree.batch import FlatBatch, PackedBatch
from collections import Counter
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class DuplicateLeafError(ValueError):
    """``finish`` on a node that is already a finished leaf (``leaf_id`` names it)."""

    def __init__(self, leaf_id: int) -> None:
        super().__init__(f"node: {leaf_id} is already a finished leaf (finishing twice)")
        self.leaf_id = leaf_id


@dataclass(frozen=True)
class NodeView:
    """One stored node: its segment and where it sits."""

    id: int
    parent: int | None
    root: int
    offset: int
    segment: Segment
    created: int

    @property
    def token_ids(self) -> list[int]:
        return self.segment.tokens.tolist()


class TrajectoryTree:
    """Prefix-sharing trajectory store; see the module docstring for the full contract."""

    def __init__(
        self,
        *,
        normalize_action: NormalizeAction | None = None,
        _path: str | None = None,
        busy_timeout_ms: int = 60_000,
    ) -> None:
        self.path = _path
        self.normalize_action = normalize_action
        self._db = Database(_path, busy_timeout_ms=busy_timeout_ms)

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        normalize_action: NormalizeAction | None = None,
        busy_timeout_ms: int = 60_000,
    ) -> TrajectoryTree:
        """Open (creating if missing) a durable store at ``path`` (SQLite, WAL mode)."""
        p = Path(path)
        if p.exists() and p.is_dir():
            raise ValueError(f"path: {p} is a directory")
        p.parent.mkdir(parents=True, exist_ok=True)
        return cls(normalize_action=normalize_action, _path=str(p), busy_timeout_ms=busy_timeout_ms)

    def close(self) -> None:
        """Close this object's connections. Committed data is already safe on disk."""
        self._db.close()

    def __enter__(self) -> TrajectoryTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrajectoryTree({self.path or ':memory:'})"

    # ================================================================== writing
    def add_root(self, prompt_token_ids: Sequence[int], meta: dict[str, Any] | None = None) -> int:
        """The root for this prompt, created if new (identical prompts share one root)."""
        tokens = prompt_tokens(prompt_token_ids)
        meta_json = _json_field(meta, "meta")
        seg = Segment(tokens, np.zeros(len(tokens), np.float32), np.zeros(len(tokens), bool), -1)
        blob = seg.to_blobs()[0]
        key = _prompt_key(blob)
        with self._db.write() as c:
            for node, stored in c.execute(
                "SELECT id, tokens FROM nodes WHERE root_key = ?", (key,)
            ).fetchall():
                if stored == blob:
                    return int(node)
            node = insert_node(c, None, 0, 0, seg, bump(c, "seq"), root_key=key, meta=meta_json)
            c.execute("UPDATE nodes SET root = id WHERE id = ?", (node,))
            return node

    def append(
        self,
        parent: int,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        policy_mask: Sequence[bool] | bool,
        version: int,
    ) -> int:
        """Append one token run under ``parent``; returns the node where it ends.

        Shares any prefix already stored under ``parent`` (splitting a node where needed).
        ``policy_mask`` is True for tokens the policy sampled; ``version`` is the policy version
        that sampled them (ignored for non-policy tokens, which get -1).
        """
        seg = make_segment(token_ids, logprobs, policy_mask, version)
        parent = _node_id(parent, "parent")
        with self._db.write() as c:
            # one statement: the parent exists, and it is no longer an open tip (it is extended)
            prow = c.execute(
                "UPDATE nodes SET tip = 0 WHERE id = ? RETURNING root, offset, n", (parent,)
            ).fetchone()
            if prow is None:
                raise ValueError(f"parent: unknown node id {parent}")
            p_root, p_offset, p_len = prow
            tip, created = descend(c, parent, int(p_root), int(p_offset) + int(p_len), seg)
            if not created:  # an existing node: open unless it is already a finished leaf
                c.execute(
                    "UPDATE nodes SET tip = 1 WHERE id = ? AND NOT EXISTS "
                    "(SELECT 1 FROM leaves WHERE id = ?)",
                    (tip, tip),
                )
            return tip

    def finish(
        self,
        node: int,
        reward: float,
        partial_score: float | None = None,
        status: str = "finished",
        info: dict[str, Any] | None = None,
        durable: bool = True,
    ) -> int:
        """Mark ``node``'s path as one finished trajectory; returns the leaf id (= ``node``).

        A path already finished raises :class:`DuplicateLeafError` (it keeps its outcome), except
        one stored ``aborted`` (its grading could not happen, see DESIGN.md "Infrastructure
        failures"): finishing that path with another status gives it that outcome (reward,
        partial score, status, info; ``info["aborted_before"]`` lists the earlier aborts' reasons).

        Returns only after a durable commit (fsync in file mode, a group sync: see
        :meth:`sync`). ``durable=False`` commits without the fsync; the caller then calls
        :meth:`sync` before it tells anyone the trajectory is stored (the rollout does, so that
        the fsync runs off the tree's writer thread and concurrent finishes share one).
        """
        node = _node_id(node, "node")
        reward = check_reward(reward, "reward")
        if partial_score is not None:
            partial_score = check_reward(partial_score, "partial_score", unit=True)
        if status not in STATUSES:
            raise ValueError(f"status: must be one of {STATUSES}, got {status!r}")
        info_json = _json_field(info, "info")
        with self._db.write() as c:
            rows = path_rows(c, node)
            if not rows:
                raise ValueError(f"node: unknown node id {node}")
            if len(rows) == 1:
                raise ValueError(f"node: {node} is a root; append a response before finishing")
            stored = c.execute("SELECT status, info FROM leaves WHERE id = ?", (node,)).fetchone()
            if stored is not None:
                if stored[0] != "aborted" or status == "aborted":
                    raise DuplicateLeafError(node)
                # an aborted path has no outcome: the first attempt that gets it graded gives it one
                before = json.loads(stored[1]) if stored[1] else {}
                merged = dict(info or {})
                merged["aborted_before"] = [
                    *before.get("aborted_before", []),
                    before.get("aborted_by", "unknown"),
                ]
                c.execute(
                    "UPDATE leaves SET reward = ?, partial_score = ?, status = ?, info = ? WHERE id = ?",
                    (reward, partial_score, status, _json_field(merged, "info"), node),
                )
            else:
                segs = [r.segment for r in rows]
                mask = np.concatenate([s.mask for s in segs])
                tokens = np.concatenate([s.tokens for s in segs])
                pol_versions = [s.version for s in segs if s.mask.any()]
                akey, okey = leaf_keys(tokens, mask, len(segs[0]), self.normalize_action)
                c.execute(
                    "INSERT INTO leaves(id, seq, root, length, start_seq, min_version, max_version, reward,"
                    " partial_score, status, info, action_key, obs_key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        node,
                        bump(c, "seq"),
                        rows[0].root,
                        int(tokens.shape[0]),
                        rows[1].created,  # the episode's start: its first response node
                        min(pol_versions, default=-1),
                        max(pol_versions, default=-1),
                        reward,
                        partial_score,
                        status,
                        info_json,
                        akey,
                        okey,
                    ),
                )
            c.execute("UPDATE nodes SET tip = 0 WHERE id = ?", (node,))
        if durable:
            self.sync()
        return node

    def group(self) -> Any:
        """A context in which this thread's writes commit together (one transaction; each write
        is its own savepoint, so a write that raises is undone alone). See ``Database.group``."""
        return self._db.group()

    def sync(self) -> None:
        """Make every write this process committed so far durable (one fsync of the WAL, shared by
        the threads that ask at the same time; nothing to do for a memory tree)."""
        self._db.sync()

    # ================================================================== reading
    def trajectory(self, leaf: int) -> Trajectory:
        """The full root-to-leaf trajectory of a finished leaf."""
        leaf = _node_id(leaf, "leaf")
        with self._db.read() as c:
            return read_trajectories(c, [leaf])[0]

    def trajectories(self, leaf_ids: Sequence[int]) -> list[Trajectory]:
        """Several trajectories read from one consistent snapshot."""
        ids = [_node_id(i, "leaf_ids") for i in leaf_ids]
        with self._db.read() as c:
            return read_trajectories(c, ids)

    def leaf_ids(self) -> list[int]:
        """Ids of all finished leaves, oldest (first finished) first."""
        with self._db.read() as c:
            return [int(r[0]) for r in c.execute("SELECT id FROM leaves ORDER BY seq")]

    def roots(self) -> list[int]:
        """Root ids, oldest first."""
        with self._db.read() as c:
            return [int(r[0]) for r in c.execute("SELECT id FROM nodes WHERE parent IS NULL ORDER BY id")]

    def children(self, node: int) -> list[int]:
        """Child node ids of ``node``, oldest first."""
        with self._db.read() as c:
            return [
                int(r[0])
                for r in c.execute("SELECT id FROM nodes WHERE parent = ? ORDER BY created, id", (node,))
            ]

    def node(self, node: int) -> NodeView:
        """One node's segment and position."""
        node = _node_id(node, "node")
        with self._db.read() as c:
            found = c.execute(f"SELECT {NODE_COLS} FROM nodes WHERE id = ?", (node,)).fetchone()
        if found is None:
            raise ValueError(f"node: unknown node id {node}")
        r = NodeRow(*found)
        return NodeView(r.id, r.parent, r.root, r.offset, r.segment, r.created)

    def root_meta(self, root: int) -> dict[str, Any] | None:
        """The ``meta`` given to :meth:`add_root` for this root."""
        with self._db.read() as c:
            r = c.execute("SELECT meta FROM nodes WHERE id = ? AND parent IS NULL", (root,)).fetchone()
        if r is None:
            raise ValueError(f"root: unknown root id {root}")
        return None if r[0] is None else json.loads(r[0])

    def open_paths(self) -> list[int]:
        """Tips of in-flight episodes: nodes returned by ``append`` that were neither extended by
        a later ``append`` nor finished. A resumed run finds its unfinished episodes here."""
        with self._db.read() as c:
            return [int(r[0]) for r in c.execute("SELECT id FROM nodes WHERE tip = 1 ORDER BY created, id")]

    def stats(self) -> dict[str, Any]:
        """Counts: logical_tokens (sum of finished path lengths), stored_tokens, nodes, leaves, …
        (``available`` leaves can still be trained on; ``aborted`` ones, whose grading could not
        happen, never are)."""
        with self._db.read() as c:
            nodes, roots, stored = c.execute(
                "SELECT COUNT(*), COALESCE(SUM(parent IS NULL), 0), COALESCE(SUM(n), 0) FROM nodes"
            ).fetchone()
            leaves, logical = c.execute("SELECT COUNT(*), COALESCE(SUM(length), 0) FROM leaves").fetchone()
            by_state = dict(c.execute("SELECT state, COUNT(*) FROM leaves GROUP BY state").fetchall())
            aborted = c.execute(
                f"SELECT COUNT(*) FROM leaves WHERE status = 'aborted' AND state = {STATE_AVAILABLE}"
            ).fetchone()[0]
            open_n = c.execute("SELECT COUNT(*) FROM nodes WHERE tip = 1").fetchone()[0]
            page = c.execute("PRAGMA page_size").fetchone()[0] * c.execute("PRAGMA page_count").fetchone()[0]
            out: dict[str, Any] = {
                "logical_tokens": int(logical),
                "stored_tokens": int(stored),
                "nodes": int(nodes),
                "roots": int(roots),
                "leaves": int(leaves),
                "available": int(by_state.get(STATE_AVAILABLE, 0)) - int(aborted),  # to train on
                "aborted": int(aborted),  # grading could not happen: never trained on
                "consumed": int(by_state.get(STATE_CONSUMED, 0)),
                "stale": int(by_state.get(STATE_STALE, 0)),
                "pruned": counter(c, "pruned"),
                "open_paths": int(open_n),
                "cursor": counter(c, "cursor"),
                "compacted_nodes": counter(c, "compacted_nodes"),
                "compacted_leaves": counter(c, "compacted_leaves"),
                "db_bytes": int(page),
            }
        out["sharing_ratio"] = out["logical_tokens"] / out["stored_tokens"] if out["stored_tokens"] else 0.0
        return out

    # ================================================================== store tools (not the trainer's path)
    def take_batch(
        self,
        B: int,
        max_per_root: int = 5,
        max_lag: int | None = None,
        current_version: int | None = None,
        *,
        prune: bool = True,
        consume: bool = True,
        allow_partial: bool = False,
    ) -> list[int] | None:
        """The next ``B`` unconsumed leaves, oldest episode first, at most ``max_per_root`` per root.

        Order: by the age of the episode (creation of its first response node), then finish
        order, so long trajectories are not overtaken by short ones started later. With
        ``max_lag`` (needs ``current_version``), leaves whose oldest policy version lags more than
        that are marked stale and never returned. With ``prune`` redundant siblings are pruned
        first (:mod:`fr_agents.tree.store`). Returns None when fewer than ``B`` leaves qualify
        (or that smaller list when ``allow_partial``; None when there are none). With
        ``consume`` (default) the leaves are durably marked consumed in the same transaction.
        """
        if not isinstance(B, int) or B < 1:
            raise ValueError(f"B: must be a positive int, got {B!r}")
        if not isinstance(max_per_root, int) or max_per_root < 1:
            raise ValueError(f"max_per_root: must be a positive int, got {max_per_root!r}")
        if max_lag is not None:
            if max_lag < 0:
                raise ValueError(f"max_lag: must be >= 0, got {max_lag}")
            if current_version is None:
                raise ValueError("current_version: required when max_lag is given")
        with self._db.write(durable=consume) as c:
            if prune:
                prune_redundant(c)
            if max_lag is not None:
                n = c.execute(
                    f"UPDATE leaves SET state = {STATE_STALE} WHERE state = {STATE_AVAILABLE}"
                    " AND min_version >= 0 AND ? - min_version > ?",
                    (int(current_version), int(max_lag)),  # type: ignore[arg-type]
                ).rowcount
                if n:
                    bump(c, "stale", n)
            picked: list[int] = []
            per_root: dict[int, int] = {}
            for leaf, root in c.execute(
                f"SELECT id, root FROM leaves WHERE state = {STATE_AVAILABLE} AND status != 'aborted'"
                " ORDER BY start_seq, seq"
            ):
                if per_root.get(root, 0) >= max_per_root:
                    continue
                per_root[root] = per_root.get(root, 0) + 1
                picked.append(int(leaf))
                if len(picked) == B:
                    break
            if not picked or (len(picked) < B and not allow_partial):
                return None
            if consume:
                _consume(c, picked)
            return picked

    # ================================================================== the learner's cursor
    def mark_consumed(self, leaf_ids: Sequence[int], durable: bool = True) -> int:
        """Mark leaves consumed as one batch, durably unless ``durable=False``; returns the new cursor.

        The trainer passes ``durable=False``: a resumed run rewinds the store to its checkpoint's
        cursor anyway, so a mark lost with the machine costs nothing (and an fsync per step does).

        Raises ValueError (nothing written) when a leaf is unknown or not available."""
        return self.mark_consumed_batches([leaf_ids], durable=durable)

    def mark_consumed_batches(self, batches: Sequence[Sequence[int]], durable: bool = True) -> int:
        """:meth:`mark_consumed` of several batches in order, in one transaction (each batch gets
        its own batch number, as with one call per batch); returns the new cursor. Nothing is
        written when any batch is refused."""
        checked = []
        for leaf_ids in batches:
            ids = [_node_id(i, "leaf_ids") for i in leaf_ids]
            if not ids:
                raise ValueError("leaf_ids: empty")
            if len(set(ids)) != len(ids):
                raise ValueError("leaf_ids: contains duplicates")
            checked.append(ids)
        if not checked:
            raise ValueError("batches: empty")
        with self._db.write(durable=durable) as c:
            for ids in checked:
                cursor = _consume(c, ids)
            return cursor

    def cursor(self) -> int:
        """Number of the last consumed batch (store it in a checkpoint)."""
        with self._db.read() as c:
            return counter(c, "cursor")

    def rewind(self, cursor: int) -> int:
        """Make leaves consumed after ``cursor`` available again; returns how many."""
        if not isinstance(cursor, int) or cursor < 0:
            raise ValueError(f"cursor: must be an int >= 0, got {cursor!r}")
        with self._db.write(durable=True) as c:
            now = counter(c, "cursor")
            if cursor > now:
                raise ValueError(f"cursor: {cursor} is ahead of the store's cursor {now}")
            n = c.execute(
                f"UPDATE leaves SET state = {STATE_AVAILABLE}, consumed_seq = NULL"
                f" WHERE state = {STATE_CONSUMED} AND consumed_seq > ?",
                (cursor,),
            ).rowcount
            c.execute("UPDATE counters SET value = ? WHERE name = 'cursor'", (cursor,))
            return int(n)

    # ================================================================== more store tools
    def unconsumed_count(self) -> int:
        """Finished leaves still available to ``take_batch`` (not consumed, stale or pruned)."""
        with self._db.read() as c:
            return int(
                c.execute(f"SELECT COUNT(*) FROM leaves WHERE state = {STATE_AVAILABLE}").fetchone()[0]
            )

    def oldest_unconsumed_version(self) -> int | None:
        """Oldest policy version among available leaves (None when none has a policy token)."""
        with self._db.read() as c:
            v = c.execute(
                f"SELECT MIN(min_version) FROM leaves WHERE state = {STATE_AVAILABLE} AND min_version >= 0"
            ).fetchone()[0]
        return None if v is None else int(v)

    def mark_pruned(self, leaf_ids: Sequence[int]) -> int:
        """Mark these leaves pruned (state 3, counted in ``stats()["pruned"]``): they stay in the
        store but are never trained on. Only available leaves change; returns how many did, so a
        repeat (a resumed run re-pruning the same batch) changes nothing."""
        ids = sorted({_node_id(i, "leaf_ids") for i in leaf_ids})
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self._db.write(durable=True) as c:
            n = c.execute(
                f"UPDATE leaves SET state = {STATE_PRUNED} WHERE state = "
                f"{STATE_AVAILABLE} AND id IN ({marks})",
                ids,
            ).rowcount
            if n:
                bump(c, "pruned", n)
            return int(n)

    def prune(self, *, actions: bool = True, observations: bool = True) -> int:
        """Prune redundant available siblings now; returns how many were pruned."""
        with self._db.write() as c:
            return prune_redundant(c, actions=actions, observations=observations)

    def compact(self, upto_cursor: int | None = None) -> int:
        """Delete nodes no longer needed: everything not on the path of an available leaf, of a
        leaf consumed after ``upto_cursor`` (default: the current cursor), or of an open tip.
        Roots always stay. Returns the number of nodes removed. Compacted leaves are gone from
        ``leaf_ids()``/``trajectory`` and cannot be rewound; pass your last checkpointed cursor.
        """
        with self._db.write() as c:
            upto = counter(c, "cursor") if upto_cursor is None else int(upto_cursor)
            removed = c.execute(
                f"""
                WITH RECURSIVE live(id) AS (
                    SELECT id FROM nodes WHERE tip = 1 OR parent IS NULL OR id IN (
                        SELECT id FROM leaves WHERE state = {STATE_AVAILABLE}
                           OR (state = {STATE_CONSUMED} AND consumed_seq > ?))
                    UNION
                    SELECT nodes.parent FROM nodes JOIN live ON nodes.id = live.id
                    WHERE nodes.parent IS NOT NULL
                )
                DELETE FROM nodes WHERE id NOT IN (SELECT id FROM live)
                """,
                (upto,),
            )
            removed = int(c.execute("SELECT changes()").fetchone()[0])  # rowcount is -1 after WITH
            gone = c.execute("DELETE FROM leaves WHERE id NOT IN (SELECT id FROM nodes)").rowcount
            if removed:
                bump(c, "compacted_nodes", removed)
            if gone:
                bump(c, "compacted_leaves", gone)
            return int(removed)

    # ================================================================== exports
    def export_flat(self, leaf_ids: Sequence[int], reward: str = "env") -> FlatBatch:
        """Padded ``[B, T]`` tensors for these leaves (see :class:`fr_agents.tree.batch.FlatBatch`)."""
        from fr_agents.tree.batch import build_flat

        return build_flat(self.trajectories(leaf_ids), reward)

    def export_packed(self, leaf_ids: Sequence[int], reward: str = "env") -> PackedBatch:
        """One tree-packed row holding every shared token once (see ``PackedBatch``)."""
        from fr_agents.tree.batch import build_packed

        return build_packed(self.trajectories(leaf_ids), reward)


# ====================================================================== helpers (one transaction)
def _node_id(x: Any, field: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{field}: expected an int node id, got {x!r}")
    return int(x)


def _json_field(obj: Any, field: str) -> str | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError(f"{field}: expected a dict or None, got {type(obj).__name__}")
    try:
        return json.dumps(obj, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field}: not JSON-serialisable ({e})") from None


def _prompt_key(blob: bytes) -> int:
    """Signed 64-bit hash of a prompt's token bytes (lookups also compare the tokens)."""
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little", signed=True)


def _consume(c: sqlite3.Connection, ids: list[int]) -> int:
    marks = ",".join("?" * len(ids))
    found = dict(c.execute(f"SELECT id, state FROM leaves WHERE id IN ({marks})", ids).fetchall())
    for i in ids:
        if i not in found:
            raise ValueError(f"leaf_ids: {i} is not a finished leaf")
        if found[i] != STATE_AVAILABLE:
            raise ValueError(
                f"leaf_ids: leaf {i} is not available (state {found[i]}: already consumed/stale/pruned)"
            )
    batch = bump(c, "cursor")
    c.execute(
        f"UPDATE leaves SET state = {STATE_CONSUMED}, consumed_seq = ? WHERE id IN ({marks})", [batch, *ids]
    )
    return batch


__all__ = [
    "DuplicateLeafError",
    "NodeRow",
    "NodeView",
    "REWARD_MODES",
    "STATUSES",
    "Trajectory",
    "TrajectoryTree",
    "STATE_PRUNED",
]


# =========================================================================== redundancy pruning

NormalizeAction = Callable[[list[int]], Hashable]

STATE_AVAILABLE, STATE_CONSUMED, STATE_STALE, STATE_PRUNED = 0, 1, 2, 3


def runs(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal mask values as ``(start, stop, is_policy)``."""
    if mask.size == 0:
        return []
    change = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [mask.size]])
    return [(int(a), int(b), bool(mask[a])) for a, b in zip(starts, stops, strict=True)]


def leaf_keys(
    tokens: np.ndarray, mask: np.ndarray, prompt_len: int, normalize_action: NormalizeAction | None = None
) -> tuple[int, int | None]:
    """``(action_key, obs_key)`` digests for one root-to-leaf path (see module doc)."""
    body_tokens, body_mask = tokens[prompt_len:], mask[prompt_len:]
    parts = runs(body_mask)
    norm = normalize_action or (lambda ids: tuple(ids))
    actions = [norm(body_tokens[a:b].tolist()) for a, b, pol in parts if pol]
    policy_idx = [i for i, (_, _, pol) in enumerate(parts) if pol]
    observations: list[tuple[int, ...]] = []
    if len(policy_idx) >= 2:
        first, last = policy_idx[0], policy_idx[-1]
        observations = [tuple(body_tokens[a:b].tolist()) for a, b, pol in parts[first + 1 : last] if not pol]
    action_key = _digest(actions)
    obs_key = _digest(observations) if observations else None
    return action_key, obs_key


def _digest(obj: Sequence[Hashable]) -> int:
    """A stable signed 64-bit digest (fits an SQLite INTEGER)."""
    raw = hashlib.blake2b(repr(list(obj)).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def prune_redundant(
    c: sqlite3.Connection, *, actions: bool = True, observations: bool = True, root: int | None = None
) -> int:
    """Mark redundant available leaves as pruned inside the caller's write transaction."""
    clauses = []
    if actions:
        clauses.append("o.action_key = l.action_key")
    if observations:
        clauses.append("(l.obs_key IS NOT NULL AND o.obs_key = l.obs_key)")
    if not clauses:
        return 0
    where_root = "AND l.root = ?" if root is not None else ""
    sql = f"""
        UPDATE leaves SET state = {STATE_PRUNED}
        WHERE id IN (
            SELECT l.id FROM leaves l
            WHERE l.state = {STATE_AVAILABLE} {where_root}
              AND EXISTS (
                  SELECT 1 FROM leaves o
                  WHERE o.root = l.root AND o.seq < l.seq AND o.state != {STATE_PRUNED}
                    AND ({" OR ".join(clauses)})
              )
        )
    """
    n = c.execute(sql, (root,) if root is not None else ()).rowcount
    if n:
        bump(c, "pruned", n)
    return int(n)


# --------------------------------------------------------------------------- J_max per tree


def keep_per_tree(
    trees: Sequence[Sequence[tuple[int, float]]], max_per_tree: int
) -> tuple[list[list[int]], list[list[int]], int, int]:
    """Which leaves of each episode tree a batch trains on: ``(kept, counts, merged, capped)``.

    ``trees[e]`` lists episode ``e``'s leaves as ``(leaf id, learner reward)`` in depth-first
    order. First, sibling branches with *identical continuations* are merged: the store keeps one
    leaf per distinct path, so identical siblings carry the same leaf id; the first stays and
    stands for all of them (``counts``: the learner trains it as that many samples, so merging
    saves compute without changing the objective). Then at most ``max_per_tree`` (J_max) distinct
    leaves are kept, chosen to keep reward diversity: the leaves are grouped by reward, and one
    leaf is taken from each reward class in turn (classes in increasing reward, each class in
    depth-first order) until J_max are taken, so a tree whose leaves disagree keeps both a low and
    a high reward. Pure and deterministic (exact resume).

    ``kept[e]`` lists the kept leaf ids in depth-first order and ``counts[e]`` the sampled leaves
    each stands for; ``merged`` counts the sibling branches merged into another (of kept leaves or
    not) and ``capped`` the distinct leaves J_max dropped.
    """
    if not isinstance(max_per_tree, int) or max_per_tree < 1:
        raise ValueError(f"max_per_root: must be a positive int, got {max_per_tree!r}")
    kept: list[list[int]] = []
    counts: list[list[int]] = []
    merged = capped = 0
    for leaves in trees:
        seen: dict[int, float] = {}  # distinct leaves in first-seen order, with their reward
        for leaf, reward in leaves:
            seen.setdefault(leaf, float(reward))
        times = Counter(leaf for leaf, _ in leaves)
        merged += len(leaves) - len(seen)
        distinct = list(seen)
        if len(distinct) <= max_per_tree:
            kept.append(distinct)
            counts.append([times[leaf] for leaf in distinct])
            continue
        classes: dict[float, list[int]] = {}
        for leaf in distinct:
            classes.setdefault(seen[leaf], []).append(leaf)
        queues = [classes[r] for r in sorted(classes)]
        chosen: set[int] = set()
        while len(chosen) < max_per_tree:
            for q in queues:
                if q and len(chosen) < max_per_tree:
                    chosen.add(q.pop(0))
        kept.append([leaf for leaf in distinct if leaf in chosen])
        counts.append([times[leaf] for leaf in kept[-1]])
        capped += len(distinct) - max_per_tree
    return kept, counts, merged, capped
