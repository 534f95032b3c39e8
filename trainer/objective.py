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

Other baselines. ``A_i`` above is the batch baseline; :mod:`trainer.advantages` computes it and the
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
batch once (:func:`trainer.advantages.batch_advantages`) and passes them to :func:`objective_loss` (the loss its
:class:`~fr_agents.objective_config.ObjectiveConfig` names),
together with ``num_rows`` (the full ``B``, or ``W`` with weights) and ``num_tokens`` (the full
batch's policy-token count, weighted with weights, for token-mean aggregation), so the sum of the
chunk losses equals the full-batch loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fr_agents.objective_config import (
    ObjectiveConfig,
    validate_aggregation,
    validate_delta,
    validate_fraction,
    validate_min_prob,
    validate_min_prob_scope,
)
from trainer.advantages import centered_advantages, group_normalized_advantages, validate_weights
from trainer.advantages import check_tensor as _check_tensor

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
    _check_tensor("behavior_log_probs", behavior_log_probs, shape=(b, t), device=dev, kind="float")
    _check_tensor("action_mask", action_mask, shape=(b, t), device=dev, kind="bool")
    _check_tensor("rewards", rewards, shape=(b,), device=dev, kind="float")
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
    _check_tensor("advantages", advantages, shape=shape, device=device, kind="float")  # type: ignore[arg-type]
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
    b, _ = _validate_rows(log_probs, behavior_log_probs, rewards, action_mask)
    validate_delta(delta)
    validate_fraction(negative_token_fraction)
    validate_min_prob(negative_min_prob)
    validate_min_prob_scope(negative_min_prob_scope)
    validate_aggregation(aggregation)
    filtering = negative_token_fraction < 1.0
    if filtering:
        if entropies is None:
            raise ValueError("entropies: required when negative_token_fraction < 1")
        if failures is None:
            raise ValueError("failures: required when negative_token_fraction < 1 (explicit bool labels)")
        _check_tensor(
            "entropies", entropies, shape=tuple(log_probs.shape), device=log_probs.device, kind="float"
        )
        _check_tensor("failures", failures, shape=(b,), device=log_probs.device, kind="bool")
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
        if negative_min_prob > 0:  # unlikely tokens of rows pushed down (and, suffix, what follows): no gradient
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
    merged rows' sample counts, as for :func:`flashreinforce_loss`. Stats: ``advantages``, ``sequence_kl`` (logged, never gating),
    ``clip_fraction``, ``ratio_mean``,
    ``ratio_max``, ``policy_tokens``.
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


def objective_loss(
    cfg: ObjectiveConfig, log_probs: Tensor, behavior_log_probs: Tensor, rewards: Tensor, action_mask: Tensor, *,
    advantages: Tensor, num_rows: float, num_tokens: float, entropies: Tensor | None = None,
    failures: Tensor | None = None, weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss ``cfg`` names, on one micro-batch of rows: :func:`flashreinforce_loss` with the
    config's switches, or :func:`grpo_loss` (``cfg.algo == "grpo"``). ``advantages``, ``num_rows``
    and ``num_tokens`` are the full batch's (module docstring, micro-batching)."""
    if cfg.algo == "grpo":
        return grpo_loss(log_probs, behavior_log_probs, rewards, action_mask, clip_eps=cfg.grpo_clip,
                         advantages=advantages, num_tokens=num_tokens, weights=weights)
    return flashreinforce_loss(
        log_probs, behavior_log_probs, rewards, action_mask, delta=cfg.delta,
        negative_token_fraction=cfg.negative_token_fraction, negative_min_prob=cfg.negative_min_prob,
        negative_min_prob_scope=cfg.negative_min_prob_scope, importance_sampling=cfg.importance_sampling,
        aggregation=cfg.aggregation, entropies=entropies, failures=failures, advantages=advantages,
        num_rows=num_rows, num_tokens=num_tokens, weights=weights,
    )
