"""Shared fixtures: one small generated ALFWorld set (one game per task type and split) per session."""

from __future__ import annotations

import pytest

pytest.importorskip("alfworld", reason="needs the alfworld extra: bash scripts/install_alfworld.sh")
pytest.importorskip("fast_downward", reason="needs fast-downward-textworld: bash scripts/install_alfworld.sh")

SEED = 11


@pytest.fixture(scope="session")
def games_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """valid_seen and valid_unseen, six games each: index i has task type TASK_TYPES[i % 6]."""
    from envs.alfworld.generate import generate

    root = tmp_path_factory.mktemp("alfworld_games")
    generate(root, {"valid_seen": 6, "valid_unseen": 6}, seed=SEED, workers=2)
    return str(root)
