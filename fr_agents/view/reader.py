"""Read-only queries over a trajectory store for the viewer (never blocks a writer).

The viewer opens the SQLite file with ``mode=ro`` and ``query_only``, one connection per
server thread, and keeps every read transaction short: in WAL mode readers never block
writers, and a short snapshot keeps the writer's WAL checkpoints moving. Nothing here writes,
so the store's own ``TrajectoryTree`` (whose constructor takes a write lock to create the
schema) is not used.

Shapes. A root's structure (:mod:`fr_agents.view.shape`) is read once per store version and cached;
a page of the tree then only reads the token blobs of the nodes it shows.

Token kinds. ``policy`` tokens have the policy mask; ``demo`` tokens are non-policy tokens inside
a leaf's ``info.demo_spans`` (scripted replies stored as SFT targets); everything else (prompt,
observations, chat-template markers) is ``env``.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fr_agents.ledger import leaf_episodes
from fr_agents.tree.nodes import SCHEMA_VERSION
from fr_agents.tree.store import STATE_CONSUMED, STATE_PRUNED, STATUSES
from fr_agents.view.decode import TokenText
from fr_agents.view.shape import STATE_NAMES, NotFound, RootShape, read_shape

SORTS = {  # sort key -> column of the grouped root query
    "id": "q.id",
    "leaves": "q.leaves",
    "reward_mean": "q.rmean",
    "reward_max": "q.rmax",
    "reward_min": "q.rmin",
}
MAX_PAGE = 2000
PREVIEW_HEAD, PREVIEW_TAIL = 220, 120


class StoreReader:
    """Read-only view of one store file (and optionally the run's episode ledger)."""

    def __init__(self, path: str | Path, ledger: str | Path | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"PATH: no trajectory store at {self.path}")
        self.ledger = Path(ledger) if ledger else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._shapes: dict[int, tuple[tuple[int, ...], RootShape]] = {}
        self._sharing: tuple[tuple[int, ...], list[dict[str, Any]]] | None = None
        with self.snapshot() as c:
            try:
                found = c.execute("SELECT value FROM counters WHERE name='schema_version'").fetchone()
            except sqlite3.DatabaseError as e:
                raise ValueError(f"PATH: {self.path} is not a trajectory store ({e})") from None
        if found is None or int(found[0]) != SCHEMA_VERSION:
            raise ValueError(f"PATH: store schema version {found and found[0]} is not {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ connections
    def _connect(self, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=10
        )
        conn.execute("PRAGMA query_only=1")
        return conn

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """One short read transaction on this thread's read-only connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect(self.path)
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def _ledger_rows(self, leaf: int) -> list[dict[str, int]]:
        if self.ledger is None or not self.ledger.is_file():
            return []
        conn = getattr(self._local, "ledger", None)
        if conn is None:
            conn = self._local.ledger = self._connect(self.ledger)
        return leaf_episodes(conn, leaf)  # the ledger's read side (fr_agents.run_layout)

    # ------------------------------------------------------------------ store-wide
    def version(self) -> tuple[int, ...]:
        """Counters that change with every write the viewer can show."""
        with self.snapshot() as c:
            return _version(c)

    def stats(self) -> dict[str, Any]:
        """Counts, like ``TrajectoryTree.stats`` (read-only)."""
        with self.snapshot() as c:
            nodes, roots, stored = c.execute(
                "SELECT COUNT(*), COALESCE(SUM(parent IS NULL), 0), COALESCE(SUM(n), 0) FROM nodes"
            ).fetchone()
            leaves, logical = c.execute("SELECT COUNT(*), COALESCE(SUM(length), 0) FROM leaves").fetchone()
            by_state = dict(c.execute("SELECT state, COUNT(*) FROM leaves GROUP BY state").fetchall())
            tips = c.execute("SELECT COUNT(*) FROM nodes WHERE tip = 1").fetchone()[0]
            counters = dict(c.execute("SELECT name, value FROM counters").fetchall())
            out = {
                "nodes": int(nodes),
                "roots": int(roots),
                "leaves": int(leaves),
                "logical_tokens": int(logical),
                "stored_tokens": int(stored),
                "open_paths": int(tips),
                "cursor": int(counters.get("cursor", 0)),
                "version": list(_version(c)),
                **{name: int(by_state.get(s, 0)) for s, name in STATE_NAMES.items()},
            }
        out["sharing_ratio"] = out["logical_tokens"] / out["stored_tokens"] if out["stored_tokens"] else 0.0
        return out

    def filter_options(self) -> dict[str, Any]:
        """What the root-list filters can choose from."""
        with self.snapshot() as c:
            envs = [
                r[0]
                for r in c.execute(
                    "SELECT DISTINCT json_extract(meta, '$.env') FROM nodes "
                    "WHERE parent IS NULL AND meta IS NOT NULL"
                )
                if isinstance(r[0], str)
            ]
            lo, hi = c.execute(
                "SELECT MIN(CASE WHEN min_version >= 0 THEN min_version END), MAX(max_version) FROM leaves"
            ).fetchone()
        return {
            "envs": sorted(envs),
            "statuses": list(STATUSES),
            "versions": [lo, hi if hi is not None and hi >= 0 else None],
            "sorts": list(SORTS),
        }

    # ------------------------------------------------------------------ the root list
    def roots(
        self,
        decoder: TokenText,
        *,
        reward_min: float | None = None,
        reward_max: float | None = None,
        status: str | None = None,
        env: str | None = None,
        version: int | None = None,
        pruned: str | None = None,
        sort: str = "id",
        order: str = "asc",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of roots. Leaf filters keep a root when at least one of its leaves passes them
        all; ``leaves`` then counts the passing leaves (``leaves_total`` counts all)."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status: must be one of {STATUSES}, got {status!r}")
        if pruned not in (None, "yes", "no"):
            raise ValueError(f"pruned: must be yes or no, got {pruned!r}")
        if sort not in SORTS:
            raise ValueError(f"sort: must be one of {tuple(SORTS)}, got {sort!r}")
        if order not in ("asc", "desc"):
            raise ValueError(f"order: must be asc or desc, got {order!r}")
        offset, limit = _page(offset, limit)
        conds: list[str] = []
        params: list[Any] = []
        if reward_min is not None:
            conds.append("l.reward >= ?")
            params.append(float(reward_min))
        if reward_max is not None:
            conds.append("l.reward <= ?")
            params.append(float(reward_max))
        if status is not None:
            conds.append("l.status = ?")
            params.append(status)
        if version is not None:
            conds.append("l.min_version <= ? AND l.max_version >= ? AND l.min_version >= 0")
            params += [int(version), int(version)]
        if pruned == "yes":
            conds.append(f"l.state = {STATE_PRUNED}")
        elif pruned == "no":
            conds.append(f"l.state != {STATE_PRUNED}")
        where, wparams = "n.parent IS NULL", []
        if env is not None:
            where += " AND json_extract(n.meta, '$.env') = ?"
            wparams.append(env)
        having = "HAVING COUNT(l.id) > 0" if conds else ""
        base = f"""
            SELECT n.id AS id, n.meta AS meta, n.tokens AS tokens,
                   COUNT(l.id) AS leaves, AVG(l.reward) AS rmean, MAX(l.reward) AS rmax, MIN(l.reward) AS rmin,
                   COALESCE(SUM(l.state = {STATE_PRUNED}), 0) AS pruned,
                   COALESCE(SUM(l.state = {STATE_CONSUMED}), 0) AS consumed,
                   MIN(CASE WHEN l.min_version >= 0 THEN l.min_version END) AS vmin,
                   MAX(l.max_version) AS vmax,
                   GROUP_CONCAT(DISTINCT l.status) AS statuses
            FROM nodes n LEFT JOIN leaves l ON l.root = n.id {"AND " + " AND ".join(conds) if conds else ""}
            WHERE {where}
            GROUP BY n.id {having}
        """  # noqa: E501
        args = params + wparams
        with self.snapshot() as c:
            total = c.execute(f"SELECT COUNT(*) FROM ({base})", args).fetchone()[0]
            rows = c.execute(
                f"SELECT *, (SELECT COUNT(*) FROM leaves WHERE root = q.id) AS leaves_total,"
                f" (SELECT COUNT(*) FROM nodes WHERE root = q.id AND tip = 1) AS open"
                f" FROM ({base}) q ORDER BY {SORTS[sort]} {order}, q.id"  # ties: oldest root first
                " LIMIT ? OFFSET ?",
                [*args, limit, offset],
            ).fetchall()
        out = []
        for r in rows:
            meta = json.loads(r[1]) if r[1] else {}
            prompt = decoder.text(np.frombuffer(r[2], dtype="<i4").tolist())
            out.append(
                {
                    "id": int(r[0]),
                    "env": meta.get("env") if isinstance(meta, dict) else None,
                    "seed": meta.get("seed") if isinstance(meta, dict) else None,
                    "meta": meta,
                    "prompt_tail": prompt[-160:],
                    "leaves": int(r[3]),
                    "reward_mean": r[4],
                    "reward_max": r[5],
                    "reward_min": r[6],
                    "pruned": int(r[7]),
                    "consumed": int(r[8]),
                    "versions": [r[9], r[10] if r[10] is not None and r[10] >= 0 else None],
                    "statuses": sorted((r[11] or "").split(",")) if r[11] else [],
                    "leaves_total": int(r[12]),
                    "open": int(r[13]),
                }
            )
        return {"total": int(total), "offset": offset, "limit": limit, "rows": out}

    # ------------------------------------------------------------------ one root
    def shape(self, root: int) -> RootShape:
        """The cached structure of ``root``'s subtree (re-read when the store moved)."""
        with self.snapshot() as c:
            ver = _version(c)
            with self._lock:
                hit = self._shapes.get(root)
            if hit is not None and hit[0] == ver:
                return hit[1]
            shape = read_shape(c, root)
        with self._lock:
            if len(self._shapes) > 64:
                self._shapes.clear()
            self._shapes[root] = (ver, shape)
        return shape

    def tree_page(
        self, root: int, decoder: TokenText, *, offset: int = 0, limit: int = 200
    ) -> dict[str, Any]:
        """Nodes of ``root``'s subtree in depth-first order, ``limit`` from ``offset``, each with
        its text runs (clipped to a preview), outcome and subtree leaf count."""
        offset, limit = _page(offset, limit)
        shape = self.shape(root)
        chunk = shape.order[offset : offset + limit]
        ids = [n for n, _ in chunk]
        blobs = self._blobs(ids)
        nodes = []
        for node, depth in chunk:
            tokens, mask = blobs[node][0], blobs[node][2]
            kinds = _kinds(mask, shape.demo.get(node, []))
            runs = _clip(decoder.runs(tokens.tolist(), kinds), PREVIEW_HEAD, PREVIEW_TAIL)
            nodes.append(
                {
                    "id": node,
                    "parent": shape.parent[node],
                    "depth": depth,
                    "offset": shape.offset[node],
                    "n": shape.size[node],
                    "policy_n": shape.policy[node],
                    "demo_n": sum(b - a for a, b in shape.demo.get(node, [])),
                    "version": shape.version[node],
                    "children": len(shape.children.get(node, [])),
                    "leaves_below": shape.below.get(node, 0),
                    "leaf": shape.leaves.get(node),
                    "runs": runs,
                }
            )
        leaves = shape.leaves.values()
        return {
            "root": root,
            "offset": offset,
            "limit": limit,
            "total_nodes": len(shape.order),
            "total_leaves": len(shape.leaves),
            "pruned": sum(1 for lf in leaves if lf["state"] == "pruned"),
            "nodes": nodes,
        }

    def node(self, node: int, decoder: TokenText) -> dict[str, Any]:
        """One node in full: per-token id, text piece, kind, behaviour log-prob and policy
        version; its text runs; its path; and, for a leaf, its outcome, info, consumer and the
        whole episode as a transcript of turns."""
        with self.snapshot() as c:
            row = c.execute("SELECT root FROM nodes WHERE id = ?", (node,)).fetchone()
        if row is None:
            raise NotFound(f"node: unknown node id {node}")
        shape = self.shape(int(row[0]))
        if node not in shape.parent:
            raise NotFound(f"node: unknown node id {node}")
        tokens, lps, mask, version = self._blobs([node])[node]
        kinds = _kinds(mask, shape.demo.get(node, []))
        off = shape.offset[node]
        toks = [
            {
                "pos": off + i,
                "id": int(t),
                "piece": decoder.piece(int(t)),
                "kind": kinds[i],
                "lp": float(lps[i]) if mask[i] else None,
                "v": version if mask[i] else -1,
            }
            for i, t in enumerate(tokens.tolist())
        ]
        leaf = shape.leaves.get(node)
        out: dict[str, Any] = {
            "id": node,
            "root": shape.root,
            "parent": shape.parent[node],
            "path": shape.path(node),
            "offset": off,
            "n": len(toks),
            "version": version,
            "runs": decoder.runs(tokens.tolist(), kinds),
            "tokens": toks,
            "children": shape.children.get(node, []),
            "leaves_below": shape.below.get(node, 0),
            "leaf": leaf,
        }
        if leaf is not None:
            with self.snapshot() as c:
                info = c.execute("SELECT info FROM leaves WHERE id = ?", (node,)).fetchone()
            out["info"] = json.loads(info[0]) if info and info[0] else {}
            out["episodes"] = self._ledger_rows(node)
            out["transcript"] = self._transcript(shape, decoder, node)
        if node == shape.root:
            out["meta"] = self._meta(node)
        return out

    def _transcript(self, shape: RootShape, decoder: TokenText, leaf: int) -> list[dict[str, Any]]:
        """The whole root-to-leaf trajectory as turns to read (:meth:`TokenText.turns`)."""
        path = shape.path(leaf)
        blobs = self._blobs(path)
        ids: list[int] = []
        kinds: list[str] = []
        for n in path:
            tokens, _, mask, _ = blobs[n]
            ids += tokens.tolist()
            kinds += _kinds(mask, shape.demo.get(n, []))
        return decoder.turns(ids, kinds)

    def compare(self, a: int, b: int, decoder: TokenText) -> dict[str, Any]:
        """Two nodes of one root side by side from their split point (deepest common node)."""
        if a == b:
            raise ValueError("b: pick two different nodes")
        with self.snapshot() as c:
            roots = dict(c.execute("SELECT id, root FROM nodes WHERE id IN (?, ?)", (a, b)).fetchall())
        for name, x in (("a", a), ("b", b)):
            if x not in roots:
                raise NotFound(f"{name}: unknown node id {x}")
        if roots[a] != roots[b]:
            raise ValueError(f"b: node {b} hangs under root {roots[b]}, node {a} under root {roots[a]}")
        shape = self.shape(int(roots[a]))
        pa, pb = shape.path(a), shape.path(b)
        k = 0
        while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
            k += 1
        split = pa[k - 1]
        sides = [pa[k:], pb[k:]]
        blobs = self._blobs([split, *sides[0], *sides[1]])

        def seg(node: int, clip: bool = False) -> dict[str, Any]:
            tokens, _, mask, version = blobs[node]
            runs = decoder.runs(tokens.tolist(), _kinds(mask, shape.demo.get(node, [])))
            return {
                "id": node,
                "n": shape.size[node],
                "policy_n": shape.policy[node],
                "version": version,
                "leaf": shape.leaves.get(node),
                "runs": _clip(runs, 0, 300) if clip else runs,
            }

        return {
            "root": shape.root,
            "split": seg(split, clip=True),
            "split_offset": shape.offset[split] + shape.size[split],
            "a": {"id": a, "segments": [seg(n) for n in sides[0]], "leaf": shape.leaves.get(a)},
            "b": {"id": b, "segments": [seg(n) for n in sides[1]], "leaf": shape.leaves.get(b)},
        }

    # ------------------------------------------------------------------ run curves from the store
    def sharing_by_batch(self) -> list[dict[str, Any]]:
        """Per consumed batch (store cursor value): distinct leaves, their logical tokens, the
        tokens their union of paths stores, and the ratio (what tree packing saves)."""
        with self.snapshot() as c:
            ver = _version(c)
            if self._sharing is not None and self._sharing[0] == ver:
                return self._sharing[1]
            parents = {
                int(i): (None if p is None else int(p), int(n))
                for i, p, n in c.execute("SELECT id, parent, n FROM nodes")
            }
            rows = c.execute(
                "SELECT consumed_seq, id, length FROM leaves WHERE "
                "consumed_seq IS NOT NULL ORDER BY consumed_seq"
            ).fetchall()
        out: list[dict[str, Any]] = []
        batches: dict[int, list[tuple[int, int]]] = {}
        for b, leaf, length in rows:
            batches.setdefault(int(b), []).append((int(leaf), int(length)))
        for b, members in sorted(batches.items()):
            seen: set[int] = set()
            stored = 0
            for leaf, _ in members:
                node: int | None = leaf
                while node is not None and node not in seen and node in parents:
                    seen.add(node)
                    p, n = parents[node]
                    stored += n
                    node = p
            logical = sum(length for _, length in members)
            out.append(
                {
                    "batch": b,
                    "leaves": len(members),
                    "logical": logical,
                    "stored": stored,
                    "ratio": logical / stored if stored else None,
                }
            )
        self._sharing = (ver, out)
        return out

    # ------------------------------------------------------------------ helpers
    def _blobs(self, ids: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}
        with self.snapshot() as c:
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                marks = ",".join("?" * len(part))
                for nid, tok, lp, mask, ver in c.execute(
                    f"SELECT id, tokens, logprobs, mask, version FROM nodes WHERE id IN ({marks})", part
                ):
                    out[int(nid)] = (
                        np.frombuffer(tok, dtype="<i4"),
                        np.frombuffer(lp, dtype="<f4"),
                        np.frombuffer(mask, dtype=np.uint8).astype(bool),
                        int(ver),
                    )
        missing = [i for i in ids if i not in out]
        if missing:  # compacted between the shape and this read
            raise NotFound(f"node: {missing[0]} is gone (the store was compacted); reload")
        return out

    def _meta(self, root: int) -> Any:
        with self.snapshot() as c:
            r = c.execute("SELECT meta FROM nodes WHERE id = ?", (root,)).fetchone()
        return json.loads(r[0]) if r and r[0] else None


# ====================================================================== module helpers
def _version(c: sqlite3.Connection) -> tuple[int, ...]:
    counters = dict(c.execute("SELECT name, value FROM counters").fetchall())
    max_id = c.execute("SELECT COALESCE(MAX(id), 0) FROM nodes").fetchone()[0]
    tips = c.execute("SELECT COUNT(*) FROM nodes WHERE tip = 1").fetchone()[0]
    return (
        int(max_id),
        int(tips),
        *(int(counters.get(k, 0)) for k in ("seq", "cursor", "pruned", "stale", "compacted_nodes")),
    )


def _page(offset: Any, limit: Any) -> tuple[int, int]:
    try:
        offset, limit = int(offset), int(limit)
    except (TypeError, ValueError):
        raise ValueError(f"offset/limit: expected integers, got {offset!r}/{limit!r}") from None
    if offset < 0:
        raise ValueError(f"offset: must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit: must lie in [1, {MAX_PAGE}], got {limit}")
    return offset, limit


def _kinds(mask: np.ndarray, demo: list[tuple[int, int]]) -> list[str]:
    kinds = ["policy" if m else "env" for m in mask.tolist()]
    for a, b in demo:
        for i in range(a, b):
            if kinds[i] == "env":
                kinds[i] = "demo"
    return kinds


def _clip(runs: list[dict[str, Any]], head: int, tail: int) -> list[dict[str, Any]]:
    """Keep the first ``head`` and last ``tail`` characters of the runs' text, with one ``…``
    run (kind ``gap``) standing for what was left out."""
    total = sum(len(r["text"]) for r in runs)
    if total <= head + tail + 1:
        return runs
    out: list[dict[str, Any]] = []
    left = head
    for r in runs:
        if left <= 0:
            break
        out.append({**r, "text": r["text"][:left]})
        left -= len(r["text"])
    out.append({"kind": "gap", "text": f" … ({total - head - tail} chars) … ", "n": 0})
    keep: list[dict[str, Any]] = []
    left = tail
    for r in reversed(runs):
        if left <= 0:
            break
        keep.append({**r, "text": r["text"][-left:]})
        left -= len(r["text"])
    return out + keep[::-1]


def finite(x: Any) -> Any:
    """JSON has no NaN/inf: map them to None (recursively)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x
