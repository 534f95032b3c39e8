"""Shared fixtures: one small generated ALFWorld set (one game per task type and split) per session."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="needs the alfworld extra: bash scripts/install_alfworld.sh")
pytest.importorskip("fast_downward", reason="needs fast-downward-textworld: bash scripts/install_alfworld.sh")

SEED = 11


def _generator_version() -> str:
    """A hash of the generator's source: cached test games are reused only by the same code."""
    src = Path(__file__).resolve().parents[3] / "envs" / "alfworld"
    h = hashlib.sha256()
    for name in ("generate.py", "sampling.py", "scenes.py", "pddl_problem.py", "engine.py"):
        h.update((src / name).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def games_root() -> str:
    """valid_seen and valid_unseen, six games each: index i has task type TASK_TYPES[i % 6].

    Generated once per generator version into the user cache (generation plans and replays every
    game, a few seconds each), then reused by later runs.
    """
    from envs.alfworld.generate import generate
    from envs.alfworld.sources import DEFAULT_CACHE

    root = DEFAULT_CACHE / f"test-set-{SEED}-{_generator_version()}"
    generate(root, {"valid_seen": 6, "valid_unseen": 6}, seed=SEED, workers=2)
    return str(root)
