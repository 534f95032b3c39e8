"""The shape of one root's subtree, as the viewer reads it from a store (no token blobs).

A root's *shape* (node ids, parents, offsets, sizes, policy counts, its leaves and the demo spans
they carry, the depth-first order and the finished leaves below each node) is read once per store
version (:class:`fr_agents.view.reader.StoreReader` caches it); a page of the tree then only reads
the token blobs of the nodes it shows. The store version is a tuple of counters that moves with
every append, finish, consumption, pruning or compaction.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from fr_agents.tree.store import STATE_AVAILABLE, STATE_CONSUMED, STATE_PRUNED, STATE_STALE

STATE_NAMES = {
    STATE_AVAILABLE: "available",
    STATE_CONSUMED: "consumed",
    STATE_STALE: "stale",
    STATE_PRUNED: "pruned",
}


class NotFound(ValueError):
    """An id that names nothing in the store (HTTP 404)."""


@dataclass
class RootShape:
    """Structure of one root's subtree (no token blobs)."""

    root: int
    parent: dict[int, int | None] = field(default_factory=dict)
    offset: dict[int, int] = field(default_factory=dict)
    size: dict[int, int] = field(default_factory=dict)
    version: dict[int, int] = field(default_factory=dict)
    policy: dict[int, int] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=dict)
    leaves: dict[int, dict[str, Any]] = field(default_factory=dict)
    demo: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # node -> [start, stop) in node
    order: list[tuple[int, int]] = field(default_factory=list)  # DFS (node, depth)
    below: dict[int, int] = field(default_factory=dict)  # finished leaves in the subtree

    def path(self, node: int) -> list[int]:
        out = [node]
        while (p := self.parent.get(out[-1])) is not None:
            out.append(p)
        return out[::-1]


def leaf_row(r: tuple[Any, ...]) -> dict[str, Any]:
    """A ``leaves`` row (id, reward, partial_score, status, state, consumed_seq, info, length,
    min_version, max_version) as the viewer shows it."""
    return {
        "reward": float(r[1]),
        "partial_score": None if r[2] is None else float(r[2]),
        "status": str(r[3]),
        "state": STATE_NAMES.get(int(r[4]), str(r[4])),
        "batch": None if r[5] is None else int(r[5]),
        "length": int(r[7]),
        "versions": [int(r[8]), int(r[9])],
    }


def read_shape(c: sqlite3.Connection, root: int) -> RootShape:
    """The shape of root ``root``, read in the caller's read transaction ``c`` (:class:`NotFound`
    when no root has that id)."""
    rows = c.execute(
        """
        WITH RECURSIVE sub(id) AS (
            SELECT id FROM nodes WHERE id = ? AND parent IS NULL
            UNION ALL SELECT nodes.id FROM nodes JOIN sub ON nodes.parent = sub.id
        )
        SELECT id, parent, offset, n, version, created, mask FROM nodes WHERE id IN (SELECT id FROM sub)
        """,
        (root,),
    ).fetchall()
    if not rows:
        raise NotFound(f"root: unknown root id {root}")
    s = RootShape(root=root)
    kids: dict[int, list[tuple[int, int]]] = {}
    for nid, parent, off, n, ver, created, mask in rows:
        nid = int(nid)
        s.parent[nid] = None if parent is None else int(parent)
        s.offset[nid], s.size[nid], s.version[nid] = int(off), int(n), int(ver)
        s.policy[nid] = bytes(mask).count(1)
        if parent is not None:
            kids.setdefault(int(parent), []).append((int(created), nid))
    s.children = {p: [nid for _, nid in sorted(v)] for p, v in kids.items()}
    for r in c.execute(
        "SELECT id, reward, partial_score, status, state, consumed_seq, info, "
        "length, min_version, max_version FROM leaves WHERE root = ?",
        (root,),
    ):
        leaf = int(r[0])
        if leaf not in s.parent:
            continue
        s.leaves[leaf] = leaf_row(r)
        if r[6] and "demo_spans" in r[6]:
            spans = json.loads(r[6]).get("demo_spans") or []
            for node in s.path(leaf):
                lo, hi = s.offset[node], s.offset[node] + s.size[node]
                for a, b in spans:
                    a, b = max(int(a), lo), min(int(b), hi)
                    if a < b and (a - lo, b - lo) not in s.demo.setdefault(node, []):
                        s.demo[node].append((a - lo, b - lo))
    # depth-first order (iterative: trees may be deep) and leaf counts below each node
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        s.order.append((node, depth))
        stack.extend((ch, depth + 1) for ch in reversed(s.children.get(node, [])))
    for node, _ in reversed(s.order):
        s.below[node] = (1 if node in s.leaves else 0) + sum(s.below[ch] for ch in s.children.get(node, []))
    return s
