"""RepoCoding-v0 episodes through the tools, on both sandbox backends."""

import gc
import json

import gymnasium
import pytest
from sandbox_params import BACKENDS, require

import envs  # noqa: F401  (registers the ids)
from envs.repo_coding.env import RepoCodingEnv
from envs.repo_coding.task import load_tasks
from tools_sandbox import live_sessions


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return require(request.param)


@pytest.fixture(autouse=True)
def no_leftover_sandboxes():
    yield
    gc.collect()
    assert not live_sessions(), live_sessions()


def test_tool_episode_fixing_the_bug_wins(backend, seed_tasks_dir):
    env = gymnasium.make("fr_agents/RepoCoding-v0", tasks=str(seed_tasks_dir), backend=backend).unwrapped
    task = load_tasks(seed_tasks_dir)[0]
    obs, info = env.reset(seed=0, options={"task_id": task.instance_id})
    assert task.problem_statement in obs and "<tool_call>" in obs and info["instance_id"] == task.instance_id
    obs, r, term, trunc, info = env.step(call("run_tests"))
    assert "passed" in obs and not (term or trunc) and r == 0.0
    src = task.mutation["file"]
    obs, *_ = env.step(call("read_file", path=src, start_line=1, end_line=3))
    assert obs.startswith("<tool_response>\n    1  ")
    obs, *_ = env.step(call("str_replace", path=src, old_str="\n", new_str="\n"))
    assert "exactly once" in obs  # ambiguous edits are refused
    # The agent applies the fix with its tools: write the patch, git apply it, then check.
    obs, *_ = env.step(
        call("write_file", path="/tmp/fix.patch", content=task.patch)
        + call("bash", command="git apply /tmp/fix.patch && git status --short")
    )
    assert f"M {src}" in obs
    obs, r, term, trunc, info = env.step(call("submit"))
    assert (r, term, trunc) == (1.0, True, False)
    assert info["won"] and info["partial_score"] == 1.0 and info["tool_calls"] == 5
    assert src in info["diff"]
    with pytest.raises(RuntimeError):
        env.step(call("submit"))
    env.close()


def test_truncation_is_graded_and_test_deletion_does_not_help(backend, seed_tasks_dir):
    env = RepoCodingEnv(tasks=str(seed_tasks_dir), backend=backend, max_turns=3, max_tool_output_chars=200)
    task = env.tasks[1]
    env.reset(options={"task_id": task.instance_id})
    obs, *_ = env.step("I think I will just look around." + call("bash", command="seq 1 2000"))
    assert "characters cut" in obs and len(obs) < 400
    obs, *_ = env.step(
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
        + call("bash", command=f"rm -f {task.visible_test_files[0]} && echo gone")
    )
    assert "unknown tool" in obs and "gone" in obs
    obs, r, term, trunc, info = env.step("no more calls")
    assert (r, term, trunc) == (0.0, False, True)
    assert info["partial_score"] == 0.0 and info["discarded_files"] == [task.visible_test_files[0]]
    env.close()


def test_agent_commits_still_count(backend, two_bug_task):
    env = RepoCodingEnv(tasks=[two_bug_task], backend=backend)
    env.reset(seed=1)
    fix_add = call("str_replace", path="calc/ops.py", old_str="a - b", new_str="a + b")
    commit = call(
        "bash", command="git -c user.name=a -c user.email=a@b commit -qam wip && git log --oneline | wc -l"
    )
    obs, *_ = env.step(fix_add + commit)
    assert obs.rstrip().endswith("2\n</tool_response>")
    obs, r, term, trunc, info = env.step(call("submit"))
    assert r == 0.0 and info["partial_score"] == 0.5 and info["f2p_passed"] == 1
    env.close()


@pytest.mark.bwrap
def test_gymnasium_env_checker_passes(seed_tasks_dir):
    from gymnasium.utils.env_checker import check_env

    env = RepoCodingEnv(tasks=str(seed_tasks_dir), backend=require("bwrap"))
    check_env(env, skip_render_check=True)
    env.close()
