"""MathVerifier-v0 behaviour: drawing tasks, given tasks, formats, format reward, retries, fork."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401
from envs.math_verifier import MathVerifierEnv
from envs.verifier import VerifierPool
from fr_agents.spaces import AnyText

ID = "fr_agents/MathVerifier-v0"


def test_default_env_draws_arithmetic_tasks_with_boxed_instruction(verifier_pool: VerifierPool) -> None:
    env = gymnasium.make(ID, pool=verifier_pool)
    assert isinstance(env.observation_space, AnyText) and isinstance(env.action_space, AnyText)
    obs, info = env.reset(seed=5)
    task = env.unwrapped.task
    assert obs.startswith(task["prompt"]) and r"\boxed{}" in obs and info["task_id"] == task["id"]
    assert env.reset(seed=5)[0] == obs  # seeded draws repeat
    obs, reward, terminated, truncated, info = env.step(f"Adding: \\boxed{{{task['answer']}}}")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["won"] and info["gold"] == task["answer"] and info["turn"] == 1


def test_test_split_and_task_params(verifier_pool: VerifierPool) -> None:
    env = MathVerifierEnv(
        task_params={"digits": 1}, split="test", task_seed=2, answer_format="plain", pool=verifier_pool
    )
    from envs.tasks import get_task_source

    test_ids = {t["id"] for t in get_task_source("arithmetic", seed=2, digits=1).split("test")}
    for s in range(10):
        env.reset(seed=s)
        assert env.task["id"] in test_ids


def test_plain_format_for_the_tiny_curriculum(verifier_pool: VerifierPool) -> None:
    env = gymnasium.make(ID, pool=verifier_pool, answer_format="plain")
    obs, _ = env.reset(options={"task": {"prompt": "12+7=", "answer": "19"}})
    assert obs == "12+7="  # no instruction for a model that cannot read
    assert env.step(" 19\n")[1] == 1.0
    env.reset(options={"task": {"prompt": "12+7=", "answer": "19"}})
    _, reward, _, _, info = env.step("18")
    assert reward == 0.0 and info["reason"] == "wrong" and info["verify_path"] == "integer"
    env.reset(options={"task": {"prompt": "12+7=", "answer": "19"}})
    _, reward, _, _, info = env.step("19" * 200)
    assert reward == 0.0 and info["reason"] == "too_long"


def test_format_reward_is_off_by_default_and_added_when_on(verifier_pool: VerifierPool) -> None:
    task = {"task": {"prompt": "2+2", "answer": "4"}}
    off = gymnasium.make(ID, pool=verifier_pool)
    off.reset(options=task)
    assert off.step(r"\boxed{5}")[1] == 0.0
    on = gymnasium.make(ID, pool=verifier_pool, format_reward=0.1)
    for reply, expected in [(r"\boxed{5}", 0.1), (r"\boxed{4}", 1.1), ("4", 0.0)]:
        on.reset(options=task)
        assert on.step(reply)[1] == pytest.approx(expected), reply


def test_multi_turn_retry_with_feedback(verifier_pool: VerifierPool) -> None:
    env = gymnasium.make(ID, pool=verifier_pool, max_turns=3)
    env.reset(options={"task": {"prompt": "What is 6*7?", "answer": "42"}})
    obs, reward, terminated, truncated, info = env.step("It is 41")
    assert reward == 0.0 and not terminated and not truncated and info["reason"] == "no_answer"
    assert r"\boxed{}" in obs and "2 attempts left" in obs
    obs, reward, terminated, truncated, _ = env.step(r"\boxed{41}")
    assert not terminated and "41 is incorrect" in obs and "42" not in obs  # never reveals the gold
    obs, reward, terminated, truncated, info = env.step(r"\boxed{42}")
    assert (reward, terminated, truncated, info["turn"]) == (1.0, True, False, 3)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(r"\boxed{42}")


def test_retries_run_out_as_truncation(verifier_pool: VerifierPool) -> None:
    env = gymnasium.make(ID, pool=verifier_pool, max_turns=2)
    env.reset(options={"task": {"prompt": "p", "answer": "1"}})
    assert env.step(r"\boxed{2}")[2:4] == (False, False)
    _, reward, terminated, truncated, _ = env.step(r"\boxed{3}")
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_fork_branches_independently(verifier_pool: VerifierPool) -> None:
    env = MathVerifierEnv(pool=verifier_pool, max_turns=2, render_mode="ansi")
    env.reset(seed=11)
    env.step(r"\boxed{-1}")
    twin = env.fork()
    assert twin.task == env.task and twin is not env
    answer = env.task["answer"]
    _, r_twin, term_twin, _, _ = twin.step(f"\\boxed{{{answer}}}")
    _, r_env, term_env, trunc_env, _ = env.step(r"\boxed{-2}")
    assert (r_twin, term_twin) == (1.0, True)
    assert (r_env, term_env, trunc_env) == (0.0, False, True)
    assert answer in twin.render() and answer not in env.render().split("[agent]")[-1]
    # the RNG state is copied too: both draw the same next task
    assert env.reset()[0] == twin.reset()[0]


def test_bad_inputs_raise_clear_errors(verifier_pool: VerifierPool) -> None:
    with pytest.raises(ValueError, match="answer_format"):
        MathVerifierEnv(answer_format="latex")
    with pytest.raises(ValueError, match="max_turns"):
        MathVerifierEnv(max_turns=0)
    env = MathVerifierEnv(task_source=None, pool=verifier_pool)
    with pytest.raises(ValueError, match="options"):
        env.reset()
    with pytest.raises(ValueError, match=r'options\["task"\]'):
        env.reset(options={"task": {"question": "x"}})
    env.reset(options={"task": {"prompt": "p", "answer": 3}})
    with pytest.raises(TypeError, match="action"):
        env.step(3)  # type: ignore[arg-type]


def test_task_list_source(verifier_pool: VerifierPool) -> None:
    tasks = [{"id": "a", "prompt": "1+1=", "answer": "2", "metadata": {}}]
    env = MathVerifierEnv(task_source=tasks, pool=verifier_pool, answer_format="plain")
    assert env.reset(seed=0)[0] == "1+1="
    assert env.step("2")[1] == 1.0
