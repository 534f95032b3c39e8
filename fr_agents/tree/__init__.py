"""The trajectory tree: a durable, prefix-sharing store of agent trajectories.

``TrajectoryTree`` (in :mod:`fr_agents.tree.store`) is what rollout workers write and the learner
reads; a :class:`Trajectory` (:mod:`fr_agents.tree.nodes`) is one root-to-leaf path;
:mod:`fr_agents.tree.batch` turns trajectories into flat or tree-packed tensors and holds the
project's one log-prob gather. Imports run one way: store (the contract, the leaves' states,
pruning) -> nodes (the SQLite database, the ``nodes`` rows, segments and trajectories), and
batch -> nodes. The batch classes import torch, so they load
lazily: rollout processes that only write stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fr_agents.tree.nodes import Trajectory
from fr_agents.tree.store import DuplicateLeafError, NodeView, TrajectoryTree

if TYPE_CHECKING:
    from fr_agents.tree.batch import FlatBatch, PackedBatch

__all__ = ["DuplicateLeafError", "FlatBatch", "NodeView", "PackedBatch", "Trajectory", "TrajectoryTree"]


def __getattr__(name: str) -> Any:
    if name in ("FlatBatch", "PackedBatch"):
        from fr_agents.tree import batch

        return getattr(batch, name)
    raise AttributeError(f"module 'fr_agents.tree' has no attribute {name!r}")
