"""Deterministic seeds for evaluation samples.

Sample ``s`` of problem ``task_id`` on bench ``bench`` gets ``sample_seed(seed, bench, task_id, s)``,
a hash of those parts (the env is reset with :func:`item_seed`, shared by the k samples): it does not depend on the order samples run in, on ``k`` (raising ``k``
from 4 to 8 reuses samples 0..3 as they are) or on which other problems are evaluated. Every
request of the episode is then seeded from it by :class:`fr_agents.policy.seeded.SeededEngine`, so an engine that honours
``SamplingOptions.seed`` (HFEngine does) reproduces the tokens.
"""

from __future__ import annotations

import hashlib
from typing import Any


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
