"""The batch path: which leaves form batch ``k``, and the tensors the learner gets for them.

One path, drawn in docs/DESIGN.md ("The batch path")::

    EpisodeSchedule.episodes(k)      which episodes form batch k (fixed by the seed, not by timing)
      -> EpisodeLedger.batch_rows(k) each finished episode's leaf, reward, tokens, version
      -> TrajectoryTree.export_*     flat [B, T] tensors, or one tree-packed row when leaves share
      -> Learner.step(batch)         one optimizer step
      -> TrajectoryTree.mark_consumed(leaves)   the store's cursor (rewound on resume)

The schedule decides, the ledger records, the tree stores and exports: batch ``k`` holds exactly
the scheduled episodes, in episode order, whatever order they finished in. The tree's own
``take_batch`` (next ``B`` unconsumed leaves, with pruning) is a store tool, not this path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fr_agents.config import TrainConfig

LedgerRow = tuple[int, int, float, int, int]  # (episode, leaf, reward, policy tokens, version)


def export_batch(k: int, cfg: TrainConfig, schedule: Any, ledger: Any, tree: Any) -> tuple[Any, list[int], list[LedgerRow]]:
    """Batch ``k`` as the learner takes it: ``(batch, leaf ids, ledger rows)``.

    Raises RuntimeError when the ledger's episodes are not the scheduled ones. The batch is a
    ``PackedBatch`` with ``trainer.packed=always``, or with ``auto`` when leaves share a prompt;
    else a ``FlatBatch``. ``rollout.reward`` picks the reward the learner sees.
    """
    rows = ledger.batch_rows(k)
    expected = [s.episode for s in schedule.episodes(k)]
    if [r[0] for r in rows] != expected:
        raise RuntimeError(f"batch {k}: the ledger holds episodes {[r[0] for r in rows][:5]}…, expected {expected[:5]}…")
    leaves = [r[1] for r in rows]
    reward_mode = cfg.rollout.reward
    flat = tree.export_flat(leaves, reward_mode)
    shared = len(set(flat.root_ids)) < len(leaves)
    packed_mode = cfg.trainer.packed
    if packed_mode == "always" or (packed_mode == "auto" and shared):
        return tree.export_packed(leaves, reward_mode), leaves, rows
    return flat, leaves, rows


def save_bad_batch(run_dir: Path, k: int, batch: Any, leaves: list[int], err: Exception) -> Path:
    """Keep a batch that gave a non-finite loss as ``RUN_DIR/nan_batch_step<k>.pt`` (for a post-mortem)."""
    path = Path(run_dir) / f"nan_batch_step{k}.pt"
    flat = batch.flat if hasattr(batch, "flat") else batch
    torch.save(
        {
            "step": k,
            "error": str(err),
            "leaf_ids": leaves,
            "token_ids": flat.token_ids,
            "behavior_logprobs": flat.behavior_logprobs,
            "action_mask": flat.action_mask,
            "rewards": flat.rewards,
            "versions": flat.versions,
            "stats": getattr(err, "stats", {}),
        },
        path,
    )
    return path
