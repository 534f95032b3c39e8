"""The ``nodes`` table's rows: placing a token segment with prefix sharing, reading paths back.

:class:`~fr_agents.tree.store.TrajectoryTree` is the front door (validation, transactions, the
leaves and their consumption); this module is what its methods do with node rows inside one
transaction ``c`` (a ``sqlite3.Connection`` already in ``BEGIN``, see :mod:`fr_agents.tree.db`):

* :func:`insert_node` writes one row (a segment's blobs plus where it sits);
* :func:`descend` places a new segment below a parent, sharing every common prefix: it walks down
  the children that start with the same *sample* (:func:`~fr_agents.tree.segment.common_prefix`),
  splits a child where the match ends inside it (the child keeps its id and its suffix, a new head
  node takes the shared part) and stores only the unshared rest as a new open tip;
* :func:`path_rows` reads one node's root-to-node path (a recursive walk up the ``parent`` links);
* :func:`read_trajectories` reads many leaves' paths with two queries per chunk of leaves and
  joins each path's segments into a :class:`~fr_agents.tree.trajectory.Trajectory`, decoding a
  node that several paths share once.

Rows come back as :class:`NodeRow` (the columns :data:`NODE_COLS` selects, blobs undecoded).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fr_agents.tree.db import bump
from fr_agents.tree.segment import Segment, common_prefix
from fr_agents.tree.trajectory import Trajectory

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
        """The row's blobs decoded into a :class:`~fr_agents.tree.segment.Segment`."""
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
                "UPDATE nodes SET parent=?, offset=?, n=?, first_tok=?, tokens=?, logprobs=?, mask=?, version=?"
                " WHERE id=?",
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


def _trajectory(leaf: int, meta: tuple[Any, ...], rows: list[NodeRow], segments: dict[int, Segment]) -> Trajectory:
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
