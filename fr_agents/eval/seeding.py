"""Deterministic seeds for evaluation samples.

Sample ``s`` of problem ``task_id`` on bench ``bench`` gets ``sample_seed(seed, bench, task_id, s)``,
a hash of those parts (the env is reset with :func:`item_seed`, shared by the k samples): it does
not depend on the order samples run in, on ``k`` (raising ``k`` from 4 to 8 reuses samples 0..3 as
they are) or on which other problems are evaluated. Every request of the episode is then seeded from
it by :class:`fr_agents.policy.seeded.SeededEngine`, so an engine that honours
``SamplingOptions.seed`` (HFEngine does) reproduces the tokens.
"""

from __future__ import annotations

from fr_agents.seeding import stable_seed  # the project's one stable-seed hash (31 bits, "\x1f"-joined)


def sample_seed(seed: int, bench: str, task_id: str, sample: int) -> int:
    """The sampling seed of sample ``sample`` of ``task_id`` (see the module docstring)."""
    return stable_seed("fr-eval", seed, bench, task_id, sample)


def item_seed(seed: int, bench: str, task_id: str) -> int:
    """The env's ``reset`` seed for ``task_id``: the same for all k samples, so they face one problem
    (this matters for envs that draw the problem, or randomise it, from the reset seed)."""
    return stable_seed("fr-eval-env", seed, bench, task_id)
