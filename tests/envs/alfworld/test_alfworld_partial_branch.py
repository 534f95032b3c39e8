"""ALFWorld-v0: a branch the rollout cuts carries the env's goal-condition progress as its reward."""

from __future__ import annotations

from typing import Any

import gymnasium
import pytest
from transformers import AutoTokenizer

import envs  # noqa: F401  (registers the ids)
from fr_agents.models import create_tiny
from tests.envs.branch_check import run_truncated_branches


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(
        create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    )


def test_cut_alfworld_branches_carry_their_partial_score(games_root: str, tok: Any) -> None:
    env = gymnasium.make("fr_agents/ALFWorld-v0", games_dir=games_root, split="valid_unseen", max_turns=10)
    leaves = run_truncated_branches(
        env, tok, "<action>look</action>", ["<action>inventory</action>", "<action>look</action>"], seed=1
    )
    assert len({x.leaf_id for x in leaves}) == 2
