"""Deterministic seeds for evaluation samples.

Sample ``s`` of problem ``task_id`` on bench ``bench`` gets ``sample_seed(seed, bench, task_id, s)``,
a hash of those parts (the env is reset with :func:`item_seed`, shared by the k samples): it does not depend on the order samples run in, on ``k`` (raising ``k``
from 4 to 8 reuses samples 0..3 as they are) or on which other problems are evaluated. Every
request of the episode is then seeded from it by :class:`SeededEngine`, so an engine that honours
``SamplingOptions.seed`` (HFEngine does) reproduces the tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fr_agents.policy.base import Engine, Generation, SamplingOptions


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed from printable parts, independent of ``PYTHONHASHSEED``."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def sample_seed(seed: int, bench: str, task_id: str, sample: int) -> int:
    """The sampling seed of sample ``sample`` of ``task_id`` (see the module docstring)."""
    return stable_seed("fr-eval", seed, bench, task_id, sample)


def item_seed(seed: int, bench: str, task_id: str) -> int:
    """The env's ``reset`` seed for ``task_id``: the same for all k samples, so they face one problem
    (this matters for envs that draw the problem, or randomise it, from the reset seed)."""
    return stable_seed("fr-eval-env", seed, bench, task_id)


class SeededEngine(Engine):
    """A view of ``engine`` whose ``n``-th request carries the seed ``stable_seed(seed, n)``."""

    def __init__(self, engine: Engine, seed: int) -> None:
        self.inner = engine
        self.seed = int(seed)
        self.calls = 0

    @property  # type: ignore[override]
    def version(self) -> int:
        return self.inner.version

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        n = self.calls
        self.calls += 1
        return await self.inner.generate(prompt_ids, replace(options, seed=stable_seed("req", self.seed, n)))

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.inner.set_weights(state_dict, version)
