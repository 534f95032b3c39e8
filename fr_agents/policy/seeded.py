"""Per-request seeds for an engine shared by many concurrent episodes.

A shared engine otherwise samples from one process-wide generator, so which episode gets which
random numbers depends on timing. :class:`SeededEngine` is a per-episode view of the engine whose
``n``-th request carries ``request_seed(n)``: re-running the episode with the same weights
reproduces its tokens, whatever else the engine is batching at the time (for engines that honour
``SamplingOptions.seed``; HFEngine does). Training derives ``request_seed`` from the episode's
scheduled seed, evaluation from the sample's seed.

Branching episodes run their branches concurrently, so one shared request counter would hand out
seeds in timing order. :meth:`SeededEngine.branch` gives each branch its own view whose seeds
derive from the parent's seeds and the branch index: a branch's tokens depend only on its path in
the episode's tree, never on how its siblings interleave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from fr_agents.policy.base import Engine, Generation, SamplingOptions
from fr_agents.seeding import stable_seed


class SeededEngine(Engine):
    """A view of ``engine`` whose ``n``-th request (n = 0, 1, ...) is sampled with ``request_seed(n)``."""

    def __init__(self, engine: Engine, request_seed: Callable[[int], int]) -> None:
        self.inner = engine
        self.request_seed = request_seed
        self.calls = 0

    @property  # type: ignore[override]
    def version(self) -> int:
        return self.inner.version

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        n = self.calls
        self.calls += 1
        return await self.inner.generate(prompt_ids, replace(options, seed=self.request_seed(n)))

    def branch(self, index: int) -> SeededEngine:
        """A view for branch ``index`` forked from this one; its ``n``-th request's seed mixes this
        view's next seed with ``index`` (so sibling and nested branches never share a seed)."""
        base = self.request_seed(self.calls)
        return SeededEngine(self.inner, lambda n: _mix(base, index, n))

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.inner.set_weights(state_dict, version)


def _mix(*parts: int) -> int:
    """A stable 63-bit seed from integers (:func:`fr_agents.seeding.stable_seed`, ``/``-joined)."""
    return stable_seed(*parts, sep="/", bits=63)
