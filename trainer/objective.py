"""The FlashREINFORCE objective and the GRPO baseline, on ``[B, T]`` rows.

One row is one complete trajectory (a root-to-leaf path of the trajectory tree) with one scalar
reward. ``action_mask`` marks the *policy* tokens of the row: the tokens the model sampled. Prompt,
observation and padding slots are excluded and may hold anything, even NaN or inf: they are replaced
by zeros before any arithmetic, so they never reach the loss or the gradients.

FlashREINFORCE (sample-mean form)::

    A_i   = R_i - mean_j R_j                                  (detached, whole batch)
    rho   = exp(logp_cur - logp_beh)                          (detached, never clipped)
    d     = p log(p/q) + (1-p) log((1-p)/(1-q)),  p = exp(logp_beh), q = exp(logp_cur)
    D_i   = max(0, sum_t d_it / T_i)                          (per-token binary KL, row mean)
    gate  = D_i <= delta                                      (a rejected row contributes nothing)
    loss  = -(1/B) sum_i (1/T_i) sum_t gate_i * keep_it * rho_it * A_i * logp_cur_it

so the gradient with respect to ``logp_cur_it`` is ``-(1/B)(1/T_i) gate_i keep_it rho_it A_i``.
``keep`` is the optional entropy filter: in *failed* rows only the ``ceil(q*T_i)`` highest-entropy
policy tokens are kept; and, with ``negative_min_prob`` ``m > 0`` (an option, not in the paper), in
rows with ``A_i < 0`` a token sampled with ``exp(logp_beh) < m`` is not kept either: pushing down a
token the policy already finds unlikely teaches little, and through a sharp attention its log-prob
gradient can be thousands of times a typical token's (on python-tool-tiny one such token can be the
whole gradient of the step that starts a collapse). With ``negative_min_prob_scope``
``suffix`` the first such token of a pushed-down row *and every later token of that row* lose their
gradient: the tokens after an unlikely deviation are its consequences, sampled in a state the policy
rarely reaches, and they are often its typical behaviour there (a correct copy that goes on after one
wrong digit). Cutting only the unlikely token (``token``, the default) leaves that row's push on
exactly those tokens. On python-tool-tiny with 8 forked answers a tree and the tree baseline, a
wrong sibling's first differing digit is below 0.01 in about half the wrong siblings, so ``token``
removes the one informative token of those rows and keeps pushing down the rest of the copy, until
the policy unlearns copying, the tool call included; ``suffix`` keeps the copy
(``benchmarks/tree_rl.py --baseline tree``; runs in docs/measurements.md). The denominators ``B`` and ``T_i``
never shrink when rows are rejected or tokens filtered, so a rejection removes mass instead of
re-weighting the survivors.

Other baselines. ``A_i`` above is the batch baseline; "Advantages" below computes it and the
others ``objective.baseline`` names: the tree baseline (a leaf also against its siblings) and the
nodes baseline, whose advantages are per token (``A_it`` ``[B, T]`` in place of ``A_i``; the loss
takes either shape).

Merged rows (``weights``). Sibling branches whose continuations came out identical are one
stored leaf, trained as one row that stands for all of them: ``w_i`` is the number of sampled
leaves row ``i`` stands for (1 without merging). Every mean above is then a mean over the sampled
leaves, so a merged batch has exactly the loss and gradient of the batch with the duplicates as
separate rows (tested)::

    mean_j R_j -> sum_j w_j R_j / sum_j w_j       (batch, tree, nodes and GRPO group baselines alike)
    loss       = -(1/W) sum_i w_i (1/T_i) sum_t ...,   W = sum_i w_i        (sample mean)
    loss       = -(1/sum_i w_i T_i) sum_i w_i sum_t ...                    (token mean, GRPO)

Merging saves the duplicates' compute; it does not down-weight the continuations the policy
samples most often, as dropping the duplicates would.

Micro-batching: the learner splits a batch into row chunks. It computes the advantages on the full
batch once (:func:`batch_advantages`) and hands them to :func:`objective_loss` in a :class:`LossInputs`
(the loss its :class:`~fr_agents.objective_config.ObjectiveConfig` names),
together with ``num_rows`` (the full ``B``, or ``W`` with weights) and ``num_tokens`` (the full
batch's policy-token count, weighted with weights, for token-mean aggregation), so the sum of the
chunk losses equals the full-batch loss.

Advantages: how much better than a baseline each row (or token) did, detached.

The loss multiplies each policy token's log-prob gradient by an advantage; :func:`batch_advantages`
computes them, once per step on the full batch (before any micro-batch), under ``objective.baseline``:

Batch baseline (``batch``, the default). ``A_i = R_i - mean_j R_j`` over the whole batch.

Credit up to progress (``rollout.reward: progress``, batch baseline only). A row cut before its
end is paid its partial score ``R_i``, but only its replies up to the one after which that score
first reached its best earned it; the replies after (a loop once a sub-goal is met) made none.
Token ``t`` of row ``i`` gets::

    A_it = R_i - mean_j R_j       t < c_i    (c_i: the row's ``credit_ends``, the first token of
    A_it = 0   - mean_j R_j       t >= c_i    the reply after its last progress)

so the baseline is the batch's mean outcome as above, and a tail that made no progress is measured
like a row that earned nothing. Rows without a cut (``c_i = T_i``) are the batch baseline's.

Tree baseline (``objective.baseline: tree``). With branching episodes, leaves that share a
branching node (the deepest node of a leaf's path that another leaf of the batch also passes
through; :func:`fr_agents.tree.batch.branching_nodes`) started from the same state, so their mean
reward is a baseline that measures what the leaf's own continuation did. Following TreeRL, it is
combined with the batch baseline (global and local advantage, averaged)::

    A_i = 1/2 (R_i - mean_j R_j) + 1/2 (R_i - mean_{j in S(i)} R_j)

where ``S(i)`` is the set of batch rows whose path passes through row ``i``'s branching node
(the leaves of that node's subtree in the batch, row ``i`` itself included). A row alone at its node
(a linear episode) has no local baseline and takes ``A_i = R_i - mean_j R_j``, so on a batch without
branching the tree baseline equals the batch baseline. The advantages are then used exactly as
above.

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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fr_agents.objective_config import (
    ObjectiveConfig,
)

Tensor = torch.Tensor

#: p and q are clamped to [PROB_EPS, 1 - PROB_EPS] before the binary KL.
PROB_EPS = 1e-6


# --------------------------------------------------------------------------- validation


def compute_dtype(log_probs: Tensor) -> torch.dtype:
    """float64 stays float64; every other floating dtype (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if log_probs.dtype == torch.float64 else torch.float32


def _validate_rows(
    log_probs: Tensor, behavior_log_probs: Tensor, rewards: Tensor, action_mask: Tensor
) -> tuple[int, int]:
    """Shared checks of the four row inputs. Returns ``(B, T)``."""
    if not isinstance(log_probs, torch.Tensor):
        raise ValueError(f"log_probs: expected a torch.Tensor, got {type(log_probs).__name__}")
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs: expected shape [B, T], got {list(log_probs.shape)}")
    if not log_probs.is_floating_point():
        raise ValueError(f"log_probs: expected a floating dtype, got {log_probs.dtype}")
    b, t = log_probs.shape
    if b == 0 or t == 0:
        raise ValueError(f"log_probs: the batch is empty (shape {list(log_probs.shape)})")
    dev = log_probs.device
    check_tensor("behavior_log_probs", behavior_log_probs, shape=(b, t), device=dev, kind="float")
    check_tensor("action_mask", action_mask, shape=(b, t), device=dev, kind="bool")
    check_tensor("rewards", rewards, shape=(b,), device=dev, kind="float")
    empty = ~action_mask.any(dim=1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"action_mask: rows {rows[:10]} have zero policy tokens")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: every reward must be finite")
    for name, lp in (("log_probs", log_probs), ("behavior_log_probs", behavior_log_probs)):
        vals = lp.detach()
        if bool((action_mask & ~torch.isfinite(vals)).any()):
            raise ValueError(f"{name}: a policy token has a non-finite log-prob")
        if bool((action_mask & (vals > 0)).any()):
            raise ValueError(f"{name}: a policy token has a positive log-prob (> 0)")
    return b, t


def _validate_advantages(advantages: Tensor, b: int, device: torch.device, width: int | None = None) -> None:
    """``[B]`` (one per row), or ``[B, T]`` (one per token, the nodes baseline) where ``width`` is given."""
    per_token = width is not None and isinstance(advantages, Tensor) and advantages.dim() == 2
    shape = (b, width) if per_token else (b,)
    check_tensor("advantages", advantages, shape=shape, device=device, kind="float")  # type: ignore[arg-type]
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError("advantages: every advantage must be finite")


def denominators(action_mask: Tensor, weights: Tensor | None = None) -> tuple[float, float]:
    """The objective's full-batch denominators ``(rows, policy tokens)``: ``B`` and ``sum_i T_i``,
    or with ``weights`` ``W = sum_i w_i`` and ``sum_i w_i T_i`` (each row counted as the sampled
    leaves it stands for). Integers without weights, so an unweighted batch divides exactly as before."""
    t_i = action_mask.sum(dim=1)
    if weights is None:
        return action_mask.shape[0], int(t_i.sum())
    w = weights.detach().to(torch.float64)
    return float(w.sum()), float((w * t_i.to(torch.float64)).sum())


def _positive_int(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: expected a positive number, got {value!r}")


# --------------------------------------------------------------------------- building blocks


def binary_kl(behavior_log_probs: Tensor, log_probs: Tensor) -> Tensor:
    """Per-token binary KL ``KL(Bern(p) || Bern(q))`` with p = exp(behaviour), q = exp(current).

    Both probabilities are clamped to ``[1e-6, 1 - 1e-6]``; the complement terms use ``log1p``.
    """
    p = behavior_log_probs.exp().clamp(PROB_EPS, 1 - PROB_EPS)
    q = log_probs.exp().clamp(PROB_EPS, 1 - PROB_EPS)
    return p * (p.log() - q.log()) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))


def entropy_filter(entropies: Tensor, failures: Tensor, action_mask: Tensor, fraction: float) -> Tensor:
    """The token-keep mask of the negative-sample entropy filter, bool ``[B, T]``.

    In every row with ``failures[i]`` True, keep the ``ceil(fraction * T_i)`` policy tokens of highest
    entropy (ties broken by position, via a stable descending sort). Other rows keep all their policy
    tokens. Non-policy slots are never kept.
    """
    t_i = action_mask.sum(dim=1).to(torch.float64)
    # ceil(q*T_i), with a tiny tolerance so that float noise (0.7*10 = 7.000000000000001) never
    # rounds a whole number up.
    k = torch.ceil(fraction * t_i - 1e-9).clamp(min=0).to(torch.long)
    score = torch.where(action_mask, entropies.detach().to(torch.float64), -math.inf)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    ranks.scatter_(1, order, positions)
    top_k = (ranks < k[:, None]) & action_mask
    return torch.where(failures[:, None], top_k, action_mask)


# --------------------------------------------------------------------------- FlashREINFORCE


@dataclass(frozen=True)
class LossInputs:
    """What the loss reads of one micro-batch of ``B`` rows of width ``T``, as the learner hands it over
    (``advantages``, ``num_rows`` and ``num_tokens`` are the full batch's: module docstring, micro-batching;
    left ``None`` they are this micro-batch's own, as for one whole batch). The tensors are checked by the
    loss, on every call; the switches that say how to use them are the
    :class:`~fr_agents.objective_config.ObjectiveConfig`, checked once."""

    log_probs: Tensor  # current policy, differentiable, [B, T]
    behavior_log_probs: Tensor  # the sampling distribution's (after temperature), [B, T]
    rewards: Tensor  # one per row, [B]
    action_mask: Tensor  # bool [B, T], True on policy tokens
    advantages: Tensor | None = None  # the full batch's, [B] (or [B, T] per token); None: centred here
    num_rows: float | None = None  # the B of 1/B: the full batch's rows (weighted); None: these rows
    num_tokens: float | None = None  # the full batch's policy tokens (weighted); None: these rows'
    entropies: Tensor | None = None  # [B, T], when the entropy filter is on
    failures: Tensor | None = None  # bool [B], when the entropy filter is on
    weights: Tensor | None = None  # [B], the sampled leaves each row stands for


def flashreinforce_loss(
    log_probs: Tensor,
    behavior_log_probs: Tensor,
    rewards: Tensor,
    action_mask: Tensor,
    *,
    delta: float = 3e-3,
    negative_token_fraction: float = 1.0,
    entropies: Tensor | None = None,
    failures: Tensor | None = None,
    negative_min_prob: float = 0.0,
    negative_min_prob_scope: str = "token",
    importance_sampling: bool = True,
    aggregation: str = "sample_mean",
    advantages: Tensor | None = None,
    num_rows: float | None = None,
    num_tokens: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The FlashREINFORCE loss on ``[B, T]`` rows (see the module docstring for the formula).

    Args:
        log_probs: current-policy log-probs of the row tokens, differentiable, ``[B, T]``.
        behavior_log_probs: log-probs under the distribution the tokens were sampled from (after
            temperature), ``[B, T]``.
        rewards: one scalar reward per row, ``[B]``.
        action_mask: bool ``[B, T]``, True on policy tokens; every row needs at least one.
        delta: the sequence trust region: rows with mean binary KL ``D_i > delta`` are rejected.
            ``inf`` disables the gate.
        negative_token_fraction: ``q``; below 1 the entropy filter is on and needs ``entropies``
            (``[B, T]``) and explicit bool ``failures`` (``[B]``).
        negative_min_prob: in rows with a negative advantage, policy tokens whose behaviour
            probability is below this get no gradient; 0 (default): off.
        negative_min_prob_scope: ``"token"`` (default): only those tokens; ``"suffix"``: in such a
            row, the first of them and every later policy token.
        importance_sampling: False replaces the ratio by 1 (ablation).
        aggregation: ``"sample_mean"`` (the paper: ``1/B * 1/T_i``) or ``"token_mean"``
            (``1/sum_i T_i``, ablation).
        advantages: precomputed full-batch advantages ``[B]`` (micro-batching); default: rewards
            centred on this batch.
        num_rows: the ``B`` of ``1/B`` (micro-batching); default: the rows given (their weights'
            sum with ``weights``).
        num_tokens: the token-mean denominator (micro-batching); default: the policy tokens given
            (each row's counted ``w_i`` times with ``weights``).
        weights: ``[B]`` float, the sampled leaves each row stands for (merged identical
            siblings, module docstring); default: 1 each.

    Returns:
        ``(loss, stats)``; stats are detached: ``advantages``, ``sequence_kl``, ``admitted`` (bool),
        ``policy_tokens`` and ``retained_tokens`` (per row, the tokens the filters keep), and
        scalars ``acceptance_rate``, ``ratio_mean``, ``ratio_max`` (over policy tokens).

    Raises:
        ValueError: on invalid inputs (the message names the argument).
        FloatingPointError: if the importance ratio of an admitted row overflows.
    """
    cfg = ObjectiveConfig(
        delta=delta,
        negative_token_fraction=negative_token_fraction,
        negative_min_prob=negative_min_prob,
        negative_min_prob_scope=negative_min_prob_scope,
        importance_sampling=importance_sampling,
        aggregation=aggregation,
    )
    cfg.check()
    inputs = LossInputs(
        log_probs,
        behavior_log_probs,
        rewards,
        action_mask,
        advantages=advantages,
        num_rows=num_rows,
        num_tokens=num_tokens,
        entropies=entropies,
        failures=failures,
        weights=weights,
    )
    return _flashreinforce(inputs, cfg)


def _flashreinforce(inputs: LossInputs, cfg: ObjectiveConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`flashreinforce_loss` on ``inputs`` under ``cfg``, whose switches were checked once
    (:meth:`~fr_agents.objective_config.ObjectiveConfig.check`: by :func:`flashreinforce_loss`, or
    when the learner is built); the tensors are checked here, on every call."""
    log_probs, behavior_log_probs, rewards, action_mask = (
        inputs.log_probs,
        inputs.behavior_log_probs,
        inputs.rewards,
        inputs.action_mask,
    )
    entropies, failures, weights = inputs.entropies, inputs.failures, inputs.weights
    advantages, num_rows, num_tokens = inputs.advantages, inputs.num_rows, inputs.num_tokens
    delta, negative_token_fraction, aggregation = cfg.delta, cfg.negative_token_fraction, cfg.aggregation
    negative_min_prob, negative_min_prob_scope = cfg.negative_min_prob, cfg.negative_min_prob_scope
    importance_sampling = cfg.importance_sampling
    b, _ = _validate_rows(log_probs, behavior_log_probs, rewards, action_mask)
    filtering = negative_token_fraction < 1.0
    if filtering:
        if entropies is None:
            raise ValueError("entropies: required when negative_token_fraction < 1")
        if failures is None:
            raise ValueError("failures: required when negative_token_fraction < 1 (explicit bool labels)")
        check_tensor(
            "entropies", entropies, shape=tuple(log_probs.shape), device=log_probs.device, kind="float"
        )
        check_tensor("failures", failures, shape=(b,), device=log_probs.device, kind="bool")
        if bool((action_mask & ~torch.isfinite(entropies)).any()):
            raise ValueError("entropies: a policy token has a non-finite entropy")
    if advantages is not None:
        _validate_advantages(advantages, b, log_probs.device, width=log_probs.shape[1])
    if num_rows is not None:
        _positive_int("num_rows", num_rows)
    if num_tokens is not None:
        _positive_int("num_tokens", num_tokens)
    if weights is not None:
        validate_weights(weights, b, log_probs.device)

    dtype = compute_dtype(log_probs)
    mask = action_mask
    zero = torch.zeros((), dtype=dtype, device=log_probs.device)
    # Masked slots become exact zeros before any arithmetic: NaN/inf there cannot leak.
    cur = torch.where(mask, log_probs.to(dtype), zero)
    beh = torch.where(mask, behavior_log_probs.detach().to(dtype), zero)
    adv = (centered_advantages(rewards, weights) if advantages is None else advantages.detach()).to(dtype)
    adv_t = adv[:, None] if adv.dim() == 1 else torch.where(mask, adv, zero)  # per row, or per token (nodes)
    t_i = mask.sum(dim=1).to(dtype)
    w = None if weights is None else weights.detach().to(dtype)

    with torch.no_grad():
        d = torch.where(mask, binary_kl(beh, cur.detach()), zero)
        seq_kl = (d.sum(dim=1) / t_i).clamp(min=0)
        admitted = seq_kl <= delta
        log_ratio = cur.detach() - beh
        ratio = torch.where(mask, log_ratio.exp(), zero)
        if importance_sampling and bool((torch.isinf(ratio) & admitted[:, None]).any()):
            raise FloatingPointError("importance ratio overflowed on a policy token of an admitted row")
        keep = (
            entropy_filter(entropies, failures, mask, negative_token_fraction)  # type: ignore[arg-type]
            if filtering
            else mask
        )
        if (
            negative_min_prob > 0
        ):  # unlikely tokens of rows pushed down (and, suffix, what follows): no gradient
            cut = beh < math.log(negative_min_prob)  # keep is already within the policy tokens
            if negative_min_prob_scope == "suffix":
                cut = cut.cumsum(dim=1) > 0
            keep = keep & ~((adv_t < 0) & cut)
        weight_ratio = ratio if importance_sampling else mask.to(dtype)
        factor = adv_t if w is None else w[:, None] * adv_t
        weight = torch.where(keep & admitted[:, None], weight_ratio * factor, zero)

    per_token = weight * cur
    if aggregation == "sample_mean":
        rows = num_rows if num_rows is not None else denominators(mask, weights)[0]
        loss = -(per_token.sum(dim=1) / t_i).sum() / rows
    else:
        tokens = num_tokens if num_tokens is not None else denominators(mask, weights)[1]
        loss = -per_token.sum() / tokens

    n_policy = mask.sum()
    stats = {
        "advantages": adv.detach(),
        "sequence_kl": seq_kl,
        "admitted": admitted,
        "acceptance_rate": admitted.to(dtype).mean(),
        "policy_tokens": mask.sum(dim=1),
        "retained_tokens": keep.sum(dim=1),
        "ratio_mean": ratio.sum() / n_policy,
        "ratio_max": ratio.masked_fill(~mask, -math.inf).max(),
    }
    return loss, stats


# --------------------------------------------------------------------------- GRPO baseline


def grpo_loss(
    log_probs: Tensor,
    behavior_log_probs: Tensor,
    rewards: Tensor,
    action_mask: Tensor,
    *,
    groups: Sequence[int] | Tensor | None = None,
    group_size: int | None = None,
    clip_eps: float = 0.2,
    eps: float = 1e-6,
    advantages: Tensor | None = None,
    num_tokens: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO baseline: group-normalised advantages, PPO-clip against behaviour, token mean.

    ``loss = -(1/sum_i T_i) sum_{i,t} min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i)`` with
    ``r = exp(logp_cur - logp_beh)`` (not detached: the gradient flows through the ratio) and
    ``A = (R - group mean) / (group std + eps)``. No KL penalty (beta = 0).

    Groups come from ``groups`` (a prompt id per row) or, failing that, ``group_size`` consecutive
    rows. ``advantages`` / ``num_tokens`` are the micro-batching overrides and ``weights`` the
    merged rows' sample counts, as for :func:`flashreinforce_loss`. Stats: ``advantages``,
    ``sequence_kl`` (logged, never gating), ``clip_fraction``, ``ratio_mean``, ``ratio_max``,
    ``policy_tokens``.
    """
    b, _ = _validate_rows(log_probs, behavior_log_probs, rewards, action_mask)
    if not isinstance(clip_eps, (int, float)) or not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps: must lie in (0, 1), got {clip_eps!r}")
    if num_tokens is not None:
        _positive_int("num_tokens", num_tokens)
    if weights is not None:
        validate_weights(weights, b, log_probs.device)
    dtype = compute_dtype(log_probs)
    w = None if weights is None else weights.detach().to(dtype)
    if advantages is not None:
        _validate_advantages(advantages, b, log_probs.device)
        adv = advantages.detach().to(dtype)
    else:
        if groups is None:
            if group_size is None:
                raise ValueError("groups: pass the prompt id of every row, or group_size")
            if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
                raise ValueError(f"group_size: expected a positive int, got {group_size!r}")
            if b % group_size:
                raise ValueError(f"group_size: {group_size} does not divide the batch of {b} rows")
            groups = torch.arange(b, device=log_probs.device) // group_size
        adv = group_normalized_advantages(rewards.to(dtype), groups, eps, w)

    mask = action_mask
    zero = torch.zeros((), dtype=dtype, device=log_probs.device)
    cur = torch.where(mask, log_probs.to(dtype), zero)
    beh = torch.where(mask, behavior_log_probs.detach().to(dtype), zero)
    ratio = torch.where(mask, (cur - beh).exp(), zero)
    unclipped = ratio * adv[:, None]
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv[:, None]
    per_token = torch.where(mask, torch.minimum(unclipped, clipped), zero)
    if w is not None:
        per_token = per_token * w[:, None]
    tokens = num_tokens if num_tokens is not None else denominators(mask, weights)[1]
    loss = -per_token.sum() / tokens

    with torch.no_grad():
        r = ratio.detach()
        d = torch.where(mask, binary_kl(beh, cur.detach()), zero)
        seq_kl = (d.sum(dim=1) / mask.sum(dim=1).to(dtype)).clamp(min=0)
        is_clipped = mask & (
            ((r > 1 + clip_eps) & (adv[:, None] > 0)) | ((r < 1 - clip_eps) & (adv[:, None] < 0))
        )
        n_policy = mask.sum()
        stats = {
            "advantages": adv.detach(),
            "sequence_kl": seq_kl,
            "clip_fraction": is_clipped.sum().to(dtype) / n_policy,
            "ratio_mean": r.sum() / n_policy,
            "ratio_max": r.masked_fill(~mask, -math.inf).max(),
            "policy_tokens": mask.sum(dim=1),
        }
    return loss, stats


# --------------------------------------------------------------------------- the configured objective


def objective_loss(inputs: LossInputs, cfg: ObjectiveConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss ``cfg`` names on one micro-batch: FlashREINFORCE (:func:`flashreinforce_loss`'s
    formula with the config's switches) or :func:`grpo_loss` (``cfg.algo == "grpo"``)."""
    x = inputs
    if cfg.algo == "grpo":
        return grpo_loss(
            x.log_probs,
            x.behavior_log_probs,
            x.rewards,
            x.action_mask,
            clip_eps=cfg.grpo_clip,
            advantages=x.advantages,
            num_tokens=x.num_tokens,
            weights=x.weights,
        )
    return _flashreinforce(x, cfg)


# =========================================================================== advantages


def check_tensor(name: str, t: object, *, shape: tuple[int, ...], device: torch.device, kind: str) -> None:
    """Refuse ``t`` unless it is a tensor of ``shape`` on ``device`` of ``kind`` ("float" or
    "bool"), naming ``name``."""
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


def progress_advantages(
    rewards: Tensor, credit_ends: Tensor, width: int, weights: Tensor | None = None
) -> Tensor:
    """Per-token advantages ``[B, width]`` of rows paid up to their last progress (module
    docstring): ``R_i - mean`` before ``credit_ends[i]``, ``0 - mean`` from there on; detached."""
    r = rewards.detach()
    ends = credit_ends.to(r.device)
    if ends.shape != r.shape:
        raise ValueError(f"credit_ends: expected one per row ({r.shape[0]}), got shape {list(ends.shape)}")
    if weights is not None:
        validate_weights(weights, r.shape[0], r.device)
    paid = torch.arange(width, device=r.device)[None, :] < ends[:, None]
    return (torch.where(paid, r[:, None], torch.zeros_like(r)[:, None]) - weighted_mean(r, weights)).detach()


def tree_advantages(
    rewards: Tensor, branch_rows: Sequence[Sequence[int]], weights: Tensor | None = None
) -> Tensor:
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
    rewards: Tensor,
    spans: Sequence[Sequence[tuple[int, int, int]]],
    width: int,
    weights: Tensor | None = None,
) -> Tensor:
    """The nodes baseline's per-token advantages ``[B, width]`` (module docstring), detached.

    ``spans[i]`` is row ``i``'s path as ``(node, start, end)`` token spans, root first
    (:func:`fr_agents.tree.batch.node_spans`); a node's value is the mean reward of the rows
    through it (over the sampled leaves they stand for, with ``weights``)."""
    r = rewards.detach()
    b = r.shape[0]
    if len(spans) != b or any(not row for row in spans):
        raise ValueError(
            f"node_spans: baseline=nodes needs each of the {b} rows' path "
            "spans (build the batch from the tree)"
        )
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
            out[i, start : min(end, width)] = value[node] - ref
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
    credit_ends: Tensor | None = None,
) -> Tensor:
    """The full batch's advantages under ``cfg`` (computed once per step, before any micro-batch).

    FlashREINFORCE: against the batch mean, the tree baseline (``cfg.baseline == "tree"``, which
    needs each row's ``branch_rows``), or per token against the tree's node values
    (``cfg.baseline == "nodes"``: each row's ``node_spans`` and the batch's ``width``;
    ``[B, width]``). With ``credit_ends`` (``[B]``, rows paid up to their last progress), per token
    against the batch mean (``[B, width]``; the batch baseline only). GRPO: group-normalised, the
    groups being ``root_ids`` (one prompt id per row) when given for every row, else
    ``cfg.grpo_group_size`` consecutive rows.
    """
    r = rewards.to(torch.float64)
    if credit_ends is not None and (cfg.algo != "flashreinforce" or cfg.baseline != "batch"):
        raise ValueError(
            f"credit_ends: rewards paid up to progress (rollout.reward=progress) take the batch baseline, "
            f"not objective.algo={cfg.algo} baseline={cfg.baseline}"
        )
    if cfg.algo == "flashreinforce":
        if not bool(torch.isfinite(r).all()):
            raise ValueError("rewards: every reward must be finite")
        if credit_ends is not None:
            return progress_advantages(r, credit_ends, width, weights)
        if cfg.baseline == "tree":
            groups = list(branch_rows or [])
            if len(groups) != r.shape[0]:
                raise ValueError(
                    "branch_rows: baseline=tree needs each row's branching "
                    "subtree (build the batch from the tree)"
                )
            return tree_advantages(r, groups, weights)
        if cfg.baseline == "nodes":
            return node_value_advantages(r, list(node_spans or []), width, weights)
        return centered_advantages(r, weights)
    roots = list(root_ids or [])
    if len(roots) == r.shape[0]:
        return group_normalized_advantages(r, roots, weights=weights)
    if r.shape[0] % cfg.grpo_group_size:
        raise ValueError(
            f"root_ids: missing, and grpo_group_size={cfg.grpo_group_size} "
            f"does not divide the batch of {r.shape[0]} rows"
        )
    return group_normalized_advantages(
        r, torch.arange(r.shape[0], device=r.device) // cfg.grpo_group_size, weights=weights
    )
