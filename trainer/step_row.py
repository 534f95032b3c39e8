"""The metrics row of one learner step: what the step trained on, what it cost, how stale it was.

:func:`step_row` is the ``step`` event :class:`~trainer.metrics.MetricsSink` writes after each
step (``metrics.jsonl``, the progress line, the plot); :func:`tree_metrics` is its part about the
batch's episode trees (leaves grown, merged, pruned, aborted, the sharing ratio).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from fr_agents.ledger import LedgerRow
from fr_agents.tree.batch import PackedBatch, TrainBatch, flat_view
from trainer.batches import BatchTrees


def step_row(
    step: int, version: int, stats: dict[str, float], rows: Sequence[LedgerRow], lags: list[int],
    batch: TrainBatch | None, trees: BatchTrees, *, seconds: float, elapsed_s: float, sampled: int | None,
) -> dict[str, float]:
    """The row of the step that made ``version`` (``step``: steps done): the batch's mean env
    reward and tokens (from its ledger ``rows``), the learner's ``stats``, throughput over the
    ``seconds`` since the previous step, the policy lag of each trained row, the tree figures and,
    when the ledger knows it, ``sampled_tokens`` (the engine's count: identical siblings included)."""
    reward = float(sum(r[2] for r in rows) / len(rows)) if rows else float("nan")
    tokens = sum(r[3] for r in rows)
    row = {
        "step": step,
        "version": version,
        "reward": reward,
        "acceptance": stats.get("acceptance_rate", float("nan")),
        "loss": stats["loss"],
        "tokens": tokens,
        "tokens_per_s": tokens / max(1e-9, seconds),
        "lag_mean": sum(lags) / max(1, len(lags)),
        "lag_max": max(lags, default=0),
        "lag_hist": dict(collections.Counter(lags)),
        "elapsed_s": elapsed_s,
        **tree_metrics(batch, trees),
        **{k: v for k, v in stats.items() if k not in ("loss",)},
    }
    if sampled is not None:
        row["sampled_tokens"] = sampled
    return row


def tree_metrics(batch: TrainBatch | None, trees: BatchTrees) -> dict[str, float]:
    """The tree figures of one step: leaves grown per episode tree, leaves trained on (rows) and
    the sampled leaves they stand for (``samples``: merged identical siblings count each), leaves
    merged/pruned, leaves scored by partial progress, the mean reward of the leaves trained on as
    the learner saw it (``learner_reward``: the partial score of a cut leaf with
    ``rollout.reward: partial``, where the step's ``reward`` is the env's), and the batch's sharing
    ratio (logical tokens over the tokens a packed forward holds; 1.0 for a flat batch without
    sharing); ``aborted`` (leaves of the batch's episodes whose grading could not happen, every
    attempt counted; never trained on), ``aborted_episodes`` (episodes every attempt of which
    aborted) and, when there were any, ``abort_reasons`` (reason -> leaves)."""
    aborted = {"aborted": float(trees.aborted), "aborted_episodes": float(trees.aborted_episodes)}
    if trees.abort_reasons:
        aborted["abort_reasons"] = dict(trees.abort_reasons)  # type: ignore[assignment]
    if batch is None:  # nothing to train on: every episode aborted
        return {"leaves_per_tree": 0.0, "leaves": 0.0, "samples": 0.0, "merged": 0.0, "pruned": 0.0,
                "partial_scored": 0.0, "learner_reward": float("nan"), "sharing_ratio": 1.0, **aborted}
    flat = flat_view(batch)
    logical = float(flat.lengths.sum())
    stored = float(batch.num_tokens) if isinstance(batch, PackedBatch) else logical
    return {
        "leaves_per_tree": trees.leaves_per_tree,
        "leaves": float(len(flat.leaf_ids)),
        "samples": float(trees.samples),
        "merged": float(trees.merged),
        "pruned": float(trees.merged + trees.capped),
        "partial_scored": float(trees.partial_scored),
        "learner_reward": float(flat.rewards.float().mean()) if len(flat.leaf_ids) else float("nan"),
        "sharing_ratio": logical / max(1.0, stored),
        **aborted,
    }
