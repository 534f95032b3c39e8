"""Trained batches marked consumed in the store, :data:`MARK_EVERY` batches to a transaction.

The marks serve a resume (which rewinds the store to its checkpoint's cursor, so a mark not yet
written costs nothing) and tools reading the store. One transaction per step would sit on the
learner's path: the rollout writes the store all the time, so each transaction re-reads its pages
and waits for the write lock in SQLite's busy sleeps.
"""

from __future__ import annotations

from fr_agents.tree import TrajectoryTree

MARK_EVERY = 25  # trained batches marked consumed in the store per transaction


class ConsumedMarks:
    """The consumed marks of trained batches, held until :data:`MARK_EVERY` of them (or
    :meth:`settle`: before a checkpoint stores the cursor, at the run's end) are written at once."""

    def __init__(self, tree: TrajectoryTree) -> None:
        self.tree = tree
        self._held: list[list[int]] = []

    def add(self, leaves: list[int]) -> None:
        """Mark the leaves of one trained batch consumed."""
        self._held.append(leaves)
        if len(self._held) >= MARK_EVERY:
            self.settle()

    def settle(self) -> None:
        """Write the marks held."""
        if self._held:
            batches, self._held = self._held, []
            self.tree.mark_consumed_batches(batches, durable=False)
