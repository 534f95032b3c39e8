"""How a learner step cuts its batch into forwards: one token budget, two batch forms.

A flat batch is cut into row micro-batches whose ``rows x padded length`` fits
``micro_batch_tokens`` (longest rows first, so a chunk's rows are of similar length and little
padding is run). A tree-packed batch is cut into groups of roots
(:meth:`~fr_agents.tree.batch.PackedBatch.root_chunks`, the same budget over ``roots x widest
root``), each one padded per-root forward; when its largest root alone is over the budget, its flat
view is micro-batched instead. The objective's denominators are the full batch's, so the step's
loss and gradient do not depend on the cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fr_agents.config import PACKED_MODES
from fr_agents.tree.batch import PackedBatch, TrainBatch

Tensor = torch.Tensor


@dataclass
class Chunking:
    """How a step's batch is cut into forwards.

    Args:
        micro_batch_tokens: token budget of one forward (rows x padded length); <= 0: one chunk.
        packed: ``"auto"`` (a packed batch runs per root when its largest root fits the budget),
            ``"always"`` or ``"never"`` (its flat view is micro-batched).
    """

    micro_batch_tokens: int = 8192
    packed: str = "auto"

    def check(self) -> None:
        if self.packed not in PACKED_MODES:
            raise ValueError(f"packed: expected one of {PACKED_MODES}, got {self.packed!r}")

    def takes_packed(self, batch: PackedBatch) -> bool:
        """Whether a packed batch takes the per-root packed path: ``always``, or ``auto`` when its
        largest root fits the token budget (else its flat view is micro-batched)."""
        if self.packed == "always":
            return True
        if self.packed != "auto":
            return False
        return self.micro_batch_tokens <= 0 or batch.max_root_tokens <= self.micro_batch_tokens

    def micro_batches(self, attention_mask: Tensor) -> list[Tensor]:
        """Row chunks whose ``rows x padded length`` fits the token budget (longest rows first)."""
        t = attention_mask.shape[1]
        positions = torch.arange(1, t + 1).expand_as(attention_mask)
        lengths = (positions * attention_mask.cpu()).max(dim=1).values
        order = torch.argsort(lengths, descending=True, stable=True)
        if self.micro_batch_tokens <= 0:
            return [order]
        chunks: list[list[int]] = []
        current: list[int] = []
        for row in order.tolist():
            width = int(lengths[current[0]]) if current else int(lengths[row])
            if current and (len(current) + 1) * width > self.micro_batch_tokens:
                chunks.append(current)
                current = []
            current.append(row)
        chunks.append(current)
        return [torch.tensor(c, dtype=torch.long) for c in chunks]


def is_packed(batch: TrainBatch) -> bool:
    """Whether ``batch`` is tree-packed (a flat view plus the index map back to rows)."""
    return isinstance(batch, PackedBatch)
