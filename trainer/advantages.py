"""Advantages: how much better than a baseline each row (or token) did, detached.

The objective (:mod:`trainer.objective`) multiplies each policy token's log-prob gradient by an
advantage; this module computes them, once per step on the full batch (:func:`batch_advantages`,
before any micro-batch), under ``objective.baseline``:

Batch baseline (``batch``, the default). ``A_i = R_i - mean_j R_j`` over the whole batch.

Tree baseline (``objective.baseline: tree``). With branching episodes, leaves that share a
branching node (the deepest node of a leaf's path that another leaf of the batch also passes
through; :func:`fr_agents.tree.batch.branching_nodes`) started from the same state, so their mean
reward is a baseline that measures what the leaf's own continuation did. Following TreeRL, it is
combined with the batch baseline (global and local advantage, averaged)::

    A_i = 1/2 (R_i - mean_j R_j) + 1/2 (R_i - mean_{j in S(i)} R_j)

where ``S(i)`` is the set of batch rows whose path passes through row ``i``'s branching node
(the leaves of that node's subtree in the batch, row ``i`` itself included). A row alone at its node (a linear episode) has no local baseline and
takes ``A_i = R_i - mean_j R_j``, so on a batch without branching the tree baseline equals the
batch baseline. The advantages are then used exactly as above.

Node-value baseline (``objective.baseline: nodes``). A tree's inner nodes get values from their
leaves' outcomes, and each token is credited with what the branch it chose was worth. With
``V(n)`` the mean reward of the batch rows whose path passes through node ``n`` (the leaves under
it), a token in node ``n`` of row ``i`` gets::

    A_it = V(n) - V(m)            m: the nearest node above n on the path with more rows through it
    A_it = V(n) - mean_j R_j      when no node above n has more rows (the top of the tree)

So below a fork a token is measured against the fork (the alternatives it chose among), and the
shared head above the first fork against the batch, as the batch baseline measures a whole row.
The advantages are per token (``[B, T]``): two rows through a shared node give its tokens the same
advantage, and the leaf's own tail gets ``R_i - V(fork)``. A linear episode (every node on one
row) gets ``R_i - mean_j R_j`` on every token: the batch baseline. The store splits nodes where
paths diverge (:func:`fr_agents.tree.batch.node_spans`), so "the nodes of a row" are exactly its
shared and unshared parts. Used as above, with ``A_it`` in place of ``A_i``.

GRPO (``objective.algo: grpo``). Group-normalised: ``(R_i - group mean) / (group std + eps)``, the
groups being the rows sampled from one prompt (:func:`group_normalized_advantages`).

Merged rows (``weights``). A row that stands for ``w_i`` identical sampled leaves counts ``w_i``
times in every mean above (the batch, tree, node and group means alike), so a merged batch has the
advantages of the batch with the duplicates as separate rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fr_agents.objective_config import ObjectiveConfig

Tensor = torch.Tensor


def check_tensor(name: str, t: object, *, shape: tuple[int, ...], device: torch.device, kind: str) -> None:
    """Refuse ``t`` unless it is a tensor of ``shape`` on ``device`` of ``kind`` ("float" or "bool"), naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if kind == "float" and not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if kind == "bool" and t.dtype != torch.bool:
        raise ValueError(f"{name}: expected dtype torch.bool, got {t.dtype}")


def validate_weights(weights: Tensor, b: int, device: torch.device) -> None:
    """Row weights (the sampled leaves each row stands for): float ``[b]`` on ``device``, finite, > 0."""
    check_tensor("weights", weights, shape=(b,), device=device, kind="float")
    if not bool((torch.isfinite(weights) & (weights > 0)).all()):
        raise ValueError("weights: every row weight must be finite and > 0")


def weighted_mean(values: Tensor, weights: Tensor | None) -> Tensor:
    if weights is None:
        return values.mean()
    w = weights.to(values.dtype)
    return (w * values).sum() / w.sum()



def centered_advantages(rewards: Tensor, weights: Tensor | None = None) -> Tensor:
    """``A_i = R_i - mean(R)`` over the whole batch (weighted by ``weights``, the sampled leaves
    each row stands for, when given), detached."""
    r = rewards.detach()
    if weights is not None:
        validate_weights(weights, r.shape[0], r.device)
    return (r - weighted_mean(r, weights)).detach()


def tree_advantages(rewards: Tensor, branch_rows: Sequence[Sequence[int]], weights: Tensor | None = None) -> Tensor:
    """The tree baseline's advantages (module docstring), detached.

    ``branch_rows[i]`` lists the rows that pass through row ``i``'s branching node (``S(i)``,
    row ``i`` included); empty when row ``i`` shares it with no other leaf. With ``weights``
    both means are over the sampled leaves the rows stand for."""
    r = rewards.detach()
    if len(branch_rows) != r.shape[0]:
        raise ValueError(f"branch_rows: expected {r.shape[0]} row lists, got {len(branch_rows)}")
    if weights is not None:
        validate_weights(weights, r.shape[0], r.device)
    global_adv = r - weighted_mean(r, weights)
    out = global_adv.clone()
    for i, rows in enumerate(branch_rows):
        if rows:
            idx = torch.as_tensor(list(rows), device=r.device)
            local = weighted_mean(r[idx], None if weights is None else weights[idx])
            out[i] = 0.5 * global_adv[i] + 0.5 * (r[i] - local)
    return out.detach()


def node_value_advantages(
    rewards: Tensor, spans: Sequence[Sequence[tuple[int, int, int]]], width: int, weights: Tensor | None = None
) -> Tensor:
    """The nodes baseline's per-token advantages ``[B, width]`` (module docstring), detached.

    ``spans[i]`` is row ``i``'s path as ``(node, start, end)`` token spans, root first
    (:func:`fr_agents.tree.batch.node_spans`); a node's value is the mean reward of the rows
    through it (over the sampled leaves they stand for, with ``weights``)."""
    r = rewards.detach()
    b = r.shape[0]
    if len(spans) != b or any(not row for row in spans):
        raise ValueError(f"node_spans: baseline=nodes needs each of the {b} rows' path spans (build the batch from the tree)")
    if weights is not None:
        validate_weights(weights, b, r.device)
    w = [1.0] * b if weights is None else weights.tolist()
    reward = r.tolist()
    mass: dict[int, float] = {}
    paid: dict[int, float] = {}
    rows: dict[int, int] = {}
    for i, row in enumerate(spans):
        for node, _, _ in row:
            mass[node] = mass.get(node, 0.0) + w[i]
            paid[node] = paid.get(node, 0.0) + w[i] * reward[i]
            rows[node] = rows.get(node, 0) + 1
    value = {n: paid[n] / mass[n] for n in mass}
    top = float(weighted_mean(r, weights))
    out = torch.zeros((b, width), dtype=r.dtype, device=r.device)
    for i, row in enumerate(spans):
        ref, above = top, None  # the value a node is measured against; the rows through the node above
        prev = top
        for node, start, end in row:
            if above is not None and rows[node] < above:
                ref = prev  # the node above had more rows: this node is one branch of it
            out[i, start:min(end, width)] = value[node] - ref
            prev, above = value[node], rows[node]
    return out.detach()


def group_normalized_advantages(
    rewards: Tensor, groups: Sequence[int] | Tensor, eps: float = 1e-6, weights: Tensor | None = None
) -> Tensor:
    """GRPO advantages ``(R - group mean) / (group std + eps)``, detached.

    ``groups[i]`` is the prompt id of row ``i`` (rows with the same id were sampled from the same
    prompt). The std is the unbiased sample std (as in common GRPO implementations). A group of one
    row has no spread to normalise by: its advantage is 0. With ``weights`` (the sampled leaves each
    row stands for) a row counts as that many samples: the mean, the std and the group size are
    those of the batch with the duplicates as separate rows.
    """
    r = rewards.detach()
    ids = torch.as_tensor(list(groups) if not isinstance(groups, Tensor) else groups, device=r.device)
    if ids.shape != r.shape:
        raise ValueError(f"groups: expected {r.shape[0]} group ids, got shape {list(ids.shape)}")
    if weights is not None:
        validate_weights(weights, r.shape[0], r.device)
    w = torch.ones_like(r) if weights is None else weights.to(r.dtype)
    _, inverse = torch.unique(ids, return_inverse=True)
    n = int(inverse.max()) + 1
    count = torch.zeros(n, dtype=r.dtype, device=r.device).index_add_(0, inverse, w)
    mean = torch.zeros(n, dtype=r.dtype, device=r.device).index_add_(0, inverse, w * r) / count
    centred = r - mean[inverse]
    sq = torch.zeros(n, dtype=r.dtype, device=r.device).index_add_(0, inverse, w * centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    scale = std[inverse] + eps
    # A singleton group, or a zero-spread group with eps=0, has all-zero centred rewards: advantage 0.
    valid = (count[inverse] > 1) & (scale > 0)
    adv = centred / torch.where(valid, scale, torch.ones_like(scale))
    return torch.where(valid, adv, torch.zeros_like(adv)).detach()


def batch_advantages(
    cfg: ObjectiveConfig,
    rewards: Tensor,
    *,
    weights: Tensor | None = None,
    branch_rows: Sequence[Sequence[int]] | None = None,
    root_ids: Sequence[int] | None = None,
    node_spans: Sequence[Sequence[tuple[int, int, int]]] | None = None,
    width: int = 0,
) -> Tensor:
    """The full batch's advantages under ``cfg`` (computed once per step, before any micro-batch).

    FlashREINFORCE: against the batch mean, the tree baseline (``cfg.baseline == "tree"``, which
    needs each row's ``branch_rows``), or per token against the tree's node values
    (``cfg.baseline == "nodes"``: each row's ``node_spans`` and the batch's ``width``; ``[B, width]``). GRPO: group-normalised, the groups being ``root_ids`` (one
    prompt id per row) when given for every row, else ``cfg.grpo_group_size`` consecutive rows.
    """
    r = rewards.to(torch.float64)
    if cfg.algo == "flashreinforce":
        if not bool(torch.isfinite(r).all()):
            raise ValueError("rewards: every reward must be finite")
        if cfg.baseline == "tree":
            groups = list(branch_rows or [])
            if len(groups) != r.shape[0]:
                raise ValueError("branch_rows: baseline=tree needs each row's branching subtree (build the batch from the tree)")
            return tree_advantages(r, groups, weights)
        if cfg.baseline == "nodes":
            return node_value_advantages(r, list(node_spans or []), width, weights)
        return centered_advantages(r, weights)
    roots = list(root_ids or [])
    if len(roots) == r.shape[0]:
        return group_normalized_advantages(r, roots, weights=weights)
    if r.shape[0] % cfg.grpo_group_size:
        raise ValueError(
            f"root_ids: missing, and grpo_group_size={cfg.grpo_group_size} does not divide the batch of {r.shape[0]} rows"
        )
    return group_normalized_advantages(r, torch.arange(r.shape[0], device=r.device) // cfg.grpo_group_size,
                                       weights=weights)
