"""Redundancy pruning: drop sibling trajectories that teach nothing new.

Two finished leaves under the same root (one GRPO group) are *redundant* when

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
import sqlite3
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from fr_agents.tree.db import bump

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
