"""The statistics of one learner step, reduced from its micro-batches.

Each micro-batch's loss returns per-row tensors (sequence KL, admitted, retained tokens) and a few
means; :func:`merge_stats` puts the rows back in batch order and reduces them to the floats of the
step's metrics row (docs/DESIGN.md "Metrics"), so the figures do not depend on how the step was cut.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from fr_agents.tree.batch import FlatBatch

Tensor = torch.Tensor


def merge_stats(
    chunks: list[dict[str, Any]], flat: FlatBatch, rewards: Tensor, advantages: Tensor, algo: str, version: int
) -> dict[str, float]:
    """Reassemble the chunks' per-row stats in batch order and reduce them to the step's floats.

    ``chunks``: one dict per micro-batch (``rows``, ``loss``, ``stats`` from the loss,
    ``forward_tokens``); ``algo``: the objective's (FlashREINFORCE reports its gate and filters,
    GRPO its clip fraction); ``version``: the policy version the staleness is measured against."""
    b = flat.token_ids.shape[0]
    policy = torch.zeros(b, dtype=torch.long)
    ratio_sum = 0.0
    ratio_max = -math.inf
    loss = 0.0
    per_row: dict[str, Tensor] = {}
    clip_tokens = 0.0
    for c in chunks:
        st, rows = c["stats"], c["rows"]
        loss += float(c["loss"])
        n = st["policy_tokens"].cpu()
        policy[rows] = n
        ratio_sum += float(st["ratio_mean"]) * int(n.sum())
        ratio_max = max(ratio_max, float(st["ratio_max"]))
        if "clip_fraction" in st:
            clip_tokens += float(st["clip_fraction"]) * int(n.sum())
        for key in ("sequence_kl", "admitted", "retained_tokens"):
            if key in st:
                if key not in per_row:
                    per_row[key] = torch.zeros(b, dtype=st[key].dtype)
                per_row[key][rows] = st[key].cpu()
    total = int(policy.sum())
    adv = advantages.detach().cpu().to(torch.float64)
    if adv.dim() == 2:  # per token (the nodes baseline): each row's mean over its policy tokens
        mask = flat.action_mask.to(torch.float64)
        adv = (adv * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    r = rewards.detach().cpu().to(torch.float64)
    stats: dict[str, float] = {
        "loss": loss,
        "rows": float(b),
        "micro_batches": float(len(chunks)),
        "forward_tokens": float(sum(c["forward_tokens"] for c in chunks)),
        "policy_tokens": float(total),
        "reward_mean": float(r.mean()),
        "adv_mean": float(adv.mean()),
        "adv_std": float(adv.std(unbiased=False)),
        "adv_min": float(adv.min()),
        "adv_max": float(adv.max()),
        "ratio_mean": ratio_sum / total,
        "ratio_max": ratio_max,
    }
    kl = per_row["sequence_kl"].to(torch.float64)
    stats.update(seq_kl_mean=float(kl.mean()), seq_kl_max=float(kl.max()))
    if algo == "flashreinforce":
        retained = int(per_row["retained_tokens"].sum())
        admitted = per_row["admitted"].to(torch.float64)
        pos, neg = adv > 0, adv < 0
        stats.update(
            acceptance_rate=float(admitted.mean()),
            # which side the gate drops: rows that the step pushes up (better than the baseline)
            # and rows that it pushes down; nan when the batch has no such row
            acceptance_positive=float(admitted[pos].mean()) if bool(pos.any()) else math.nan,
            acceptance_negative=float(admitted[neg].mean()) if bool(neg.any()) else math.nan,
            retained_tokens=float(retained),
            retained_fraction=retained / total,
        )
    else:  # GRPO has no gate and no filter: every row and token counts
        stats.update(
            acceptance_rate=1.0,
            retained_tokens=float(total),
            retained_fraction=1.0,
            clip_fraction=clip_tokens / total,
        )
    versions = getattr(flat, "versions", None)
    if isinstance(versions, Tensor) and versions.shape == flat.action_mask.shape:
        v = versions[flat.action_mask]
        if v.numel() and bool((v >= 0).all()):
            lag = version - v.to(torch.float64)
            stats["staleness_mean"] = float(lag.mean())
            stats["staleness_max"] = float(lag.max())
    return stats
