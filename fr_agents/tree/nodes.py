"""The ``nodes`` table's rows: the token segments they hold, placing one with prefix sharing, reading
paths back as trajectories.

:class:`~fr_agents.tree.store.TrajectoryTree` is the front door (validation, transactions, the
leaves and their consumption); this module is what its methods do with node rows inside one
transaction ``c`` (a ``sqlite3.Connection`` already in ``BEGIN``, see :mod:`fr_agents.tree.db`):

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

Token segments: the unit a tree node stores, with validation and the sharing rule.

A segment is a run of tokens appended in one call. Every token carries four facts: its id, the
behaviour log-prob (policy tokens only; 0.0 elsewhere), the policy mask and the policy version
(``-1`` for prompt/environment tokens). A node stores one version scalar; the per-token version
is ``version`` where the mask is True and ``-1`` elsewhere, so four columns cost 9 bytes a token
(int32 id + float32 log-prob + one mask byte).

Two tokens are *the same sample* when id, mask, log-prob bits and effective version all agree.
The tree shares a prefix only as far as that holds (:func:`common_prefix`): identical tokens
with different log-probs or versions are different samples and are never merged.

``Trajectory``: one root-to-leaf path of the tree, as :func:`read_trajectories` reads it and the
batch builders (:mod:`fr_agents.tree.batch`) pad and pack it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fr_agents.tree.db import bump

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
REWARD_MODES = ("env", "partial")


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
        """The reward the learner sees: the env reward, or (``"partial"``) the partial score of an
        unfinished (truncated/aborted) leaf when it has one."""
        if mode not in REWARD_MODES:
            raise ValueError(f"reward: must be one of {REWARD_MODES}, got {mode!r}")
        if mode == "partial" and self.status != "finished" and self.partial_score is not None:
            return float(self.partial_score)
        return float(self.reward)

    @property
    def failed(self) -> bool:
        """A failure: the episode did not finish normally, or its env reward is <= 0."""
        return self.status != "finished" or self.reward <= 0
