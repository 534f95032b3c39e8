"""Partial-progress rewards of truncated branches: MathVerifier-v0 and PythonTool-v0
(ALFWorld-v0 and RepoCoding-v0 in their own folders, next to their fixtures)."""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import pytest
from transformers import AutoTokenizer

import envs  # noqa: F401  (registers the envs)
from fr_agents.models import create_tiny
from tests.envs.branch_check import run_truncated_branches

TASK = {"id": "t1", "prompt": "What is 2 + 3?", "answer": "5"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(
        create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    )


def test_math_verifier_truncated_branch_scores_zero_progress(tok: Any, verifier_pool: Any) -> None:
    env = gymnasium.make("fr_agents/MathVerifier-v0", max_turns=4, answer_format="plain", pool=verifier_pool)
    leaves = run_truncated_branches(env, tok, "7", ["8", "9"], task=TASK)
    assert [x.partial_score for x in leaves] == [0.0, 0.0]


def test_python_tool_truncated_branch_scores_its_tool_progress(
    tok: Any, backend: str, verifier_pool: Any
) -> None:
    env = gymnasium.make("fr_agents/PythonTool-v0", max_turns=4, backend=backend, verifier_pool=verifier_pool)

    def call(code: str) -> str:
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"

    # turn 0 runs fine but prints 6; at turn 1 one branch prints 5 (the gold, as the last number of
    # the last call: 1/2), the other's last call fails (0, though an earlier call ran fine)
    leaves = run_truncated_branches(
        env, tok, call("print(2 * 3)"), [call("print(2 + 3)"), call("print(1 / 0)")], task=TASK
    )
    assert sorted(x.partial_score for x in leaves) == pytest.approx([0.0, 0.5])
    assert all(x.reward == 0.0 for x in leaves)
