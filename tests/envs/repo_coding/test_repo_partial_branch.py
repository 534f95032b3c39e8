"""RepoCoding-v0 forks its working tree into a new sandbox, and a branch the rollout cuts is scored
by grading that tree (partial progress), on both sandbox backends."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
from sandbox_params import BACKENDS, require
from transformers import AutoTokenizer

from envs.repo_coding.env import RepoCodingEnv
from envs.repo_coding.task import load_tasks
from fr_agents.models import create_tiny
from tests.envs.branch_check import run_truncated_branches
from tools_sandbox import live_sessions


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return require(request.param)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(
        create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    )


def test_cut_branches_are_graded_on_their_own_forked_working_tree(
    backend: str, seed_tasks_dir: Any, tok: Any
) -> None:
    task = load_tasks(seed_tasks_dir)[0]
    env = RepoCodingEnv(tasks=str(seed_tasks_dir), backend=backend, max_turns=6)
    write = call("write_file", path="/tmp/fix.patch", content=task.patch)
    # both branches inherit the written patch file (the forked tree); only one applies it
    leaves = run_truncated_branches(
        env,
        tok,
        write,
        [call("bash", command="git apply /tmp/fix.patch"), call("bash", command="true")],
        task={"id": task.instance_id},
        max_context=16384,
    )
    assert sorted(x.partial_score for x in leaves) == [0.0, 1.0]
    assert all(x.reward == 0.0 for x in leaves)  # cut before submit: no env reward
    gc.collect()
    assert not live_sessions(), live_sessions()
