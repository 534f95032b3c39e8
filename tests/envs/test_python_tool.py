"""PythonTool-v0: multi-turn episodes with a persistent sandboxed Python, on both backends."""

from __future__ import annotations

import gc
import json

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.python_tool import PythonToolEnv, parse_tag_calls, parse_tool_calls
from tools_sandbox import SandboxLimits, live_sessions
from tools_sandbox.reaper import leftovers

LIMITS = SandboxLimits(memory_mb=256, pids=32, tmpfs_mb=16, call_timeout=5.0)
TASK = {"prompt": "What is 123456789 * 987654321?", "answer": "121932631112635269"}


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.fixture(scope="module", autouse=True)
def no_leftover_sandboxes():
    yield
    gc.collect()
    assert not live_sessions(), live_sessions()
    left = leftovers()
    assert not any(left.values()), left


def make(backend: str, verifier_pool, **kw) -> PythonToolEnv:
    return PythonToolEnv(task_source=None, backend=backend, limits=LIMITS, verifier_pool=verifier_pool, **kw)


def test_multi_turn_state_persists_and_answer_is_graded(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool)
    obs, info = env.reset(seed=0, options={"task": TASK})
    assert "python" in obs and TASK["prompt"] in obs and info["tool_calls"] == 0
    obs, r, term, trunc, info = env.step("Let me compute.\n" + call("a = 123456789\nb = 987654321"))
    assert obs == "<tool_response>\n(no output)\n</tool_response>" and not (term or trunc) and r == 0.0
    sb = env.sandbox
    assert sb is not None and sb.backend == backend
    obs, r, term, trunc, info = env.step(call("import math\nprint(a * b)"))
    assert obs == "<tool_response>\n121932631112635269\n</tool_response>"
    assert info["tool_calls"] == 2 and not term
    obs, r, term, trunc, info = env.step(call("a * b + math.gcd(4, 6)"))  # state + imports persist
    assert "121932631112635271" in obs
    obs, r, term, trunc, info = env.step("So the product is \\boxed{121932631112635269}.")
    assert (r, term, trunc) == (1.0, True, False)
    assert info["correct"] and info["tool_calls"] == 3 and info["turn"] == 4
    assert env.sandbox is None and sb.closed  # the sandbox closes with the episode
    env.close()


def test_a_tool_call_whose_sandbox_failed_is_an_infrastructure_failure_not_an_observation(
    backend, verifier_pool
) -> None:
    """The episode's real sandbox is closed under the env (as a dead daemon leaves it): the next tool
    call raises InfrastructureFailure (the rollout stores the leaf aborted and retries the episode)
    instead of showing the agent an error it did not cause."""
    from fr_agents.errors import InfrastructureFailure

    env = make(backend, verifier_pool)
    env.reset(seed=0, options={"task": TASK})
    env.step(call("a = 1"))
    sb = env.sandbox
    sb.close()
    with pytest.raises(InfrastructureFailure) as failure:
        env.step(call("print(a)"))
    assert failure.value.reason == "sandbox_failed" and env.sandbox is None
    env.close()


def test_malformed_calls_get_explanations_and_the_episode_goes_on(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool)
    env.reset(options={"task": TASK})
    bad = [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "bash", "arguments": {"code": "ls"}}</tool_call>', "unknown tool 'bash'"),
        ('<tool_call>{"name": "python", "arguments": {"src": "1"}}</tool_call>', 'missing "code"'),
        ('<tool_call>{"name": "python", "arguments": {"code": "1"}}', "never closed"),
    ]
    for text, why in bad:
        obs, r, term, trunc, info = env.step(text)
        assert obs.startswith("<tool_response>") and why in obs, obs
        assert not term and not trunc and r == 0.0
    assert info["malformed_calls"] == 4 and info["tool_calls"] == 0
    # Arguments given as a JSON string, and raw newlines inside the code string, are accepted.
    raw = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(7)\\"}"}</tool_call>'
    assert "7" in env.step(raw)[0]
    assert (
        "8"
        in env.step('<tool_call>{"name": "python", "arguments": {"code": "x = 8\nprint(x)"}}</tool_call>')[0]
    )
    _, r, term, _, _ = env.step("\\boxed{121932631112635269}")
    assert r == 1.0 and term


def test_errors_timeouts_and_restarts_are_reported(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool, call_timeout=1.5)
    env.reset(options={"task": TASK})
    obs = env.step(call("x = 1\n1 / 0"))[0]
    assert "ZeroDivisionError" in obs
    obs = env.step(call("while True:\n    pass"))[0]
    assert "timed out" in obs and "state" in obs
    obs = env.step(call("print(x)"))[0]  # the state was reset by the restart
    assert "NameError" in obs
    env.close()
    assert env.sandbox is None


def test_fenced_blocks_when_enabled(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool, allow_fenced=True)
    env.reset(options={"task": TASK})
    obs, _, term, _, info = env.step("Compute:\n```python\nprint(123456789 * 987654321)\n```")
    assert "121932631112635269" in obs and not term and info["tool_calls"] == 1
    # A reply with a final answer is graded even when it shows code.
    _, r, term, _, _ = env.step("```python\nprint(1)\n```\n\\boxed{121932631112635269}")
    assert r == 1.0 and term
    plain = make(backend, verifier_pool)
    plain.reset(options={"task": TASK})
    _, r, term, _, info = plain.step("```python\nprint(1)\n```")  # not a call when fenced is off
    assert term and r == 0.0 and info["tool_calls"] == 0


def test_max_turns_truncates(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool, max_turns=3)
    env.reset(options={"task": TASK})
    for _ in range(2):
        assert not env.step(call("print(1)"))[2]
    obs, r, term, trunc, info = env.step(call("print(1)") + " \\boxed{1}")
    assert trunc and not term and r == 0.0 and info["tool_calls"] == 2
    assert env.sandbox is None


def test_fork_replays_state_into_a_fresh_sandbox(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool)
    env.reset(options={"task": TASK})
    env.step(call("x = 5\nimport os\npid = os.getpid()"))
    twin = env.fork()
    assert twin.sandbox is None
    assert "6" in twin.step(call("x += 1\nprint(x)"))[0]
    assert "5" in env.step(call("print(x)"))[0]  # the original is unaffected
    assert twin.sandbox is not env.sandbox
    grand = twin.fork()  # a fork of a fork replays both cells
    assert "7" in grand.step(call("print(x + 1)"))[0]
    for e in (env, twin, grand):
        assert e.step("\\boxed{121932631112635269}")[1] == 1.0
        assert e.sandbox is None


def test_sandbox_closes_on_close_and_on_garbage_collection(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool)
    env.reset(options={"task": TASK})
    env.step(call("print(1)"))
    sb = env.sandbox
    env.close()
    assert sb.closed
    env = make(backend, verifier_pool)
    env.reset(options={"task": TASK})
    env.step(call("print(1)"))
    n_before = len(live_sessions())
    del env
    gc.collect()
    assert len(live_sessions()) == n_before - 1


def test_warm_pool_gives_each_episode_a_fresh_session(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool, sandbox_pool_size=1)
    seen = []
    for _ in range(2):
        env.reset(options={"task": TASK})
        obs = env.step(call("print(globals().get('mark'))\nmark = 1"))[0]
        assert "None" in obs  # nothing from the previous episode
        seen.append(env.sandbox)
        env.step("\\boxed{0}")
    assert seen[0] is not seen[1] and all(s.closed for s in seen)
    from tools_sandbox.pool import close_shared_pools

    close_shared_pools()


def test_gymnasium_make_and_registry(verifier_pool) -> None:
    from fr_agents.registry import BUILTIN_ENVS

    assert BUILTIN_ENVS["fr_agents/PythonTool-v0"][0] == "envs.python_tool:PythonToolEnv"
    env = gymnasium.make("fr_agents/PythonTool-v0", verifier_pool=verifier_pool)
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    _, r, term, _, info = env.step("no answer here")
    assert term and r == 0.0 and info["reason"] == "no_answer"
    env.close()


def test_parse_and_validation() -> None:
    assert parse_tool_calls("no calls") == []
    assert parse_tool_calls(call("1") + call("2")) == [{"code": "1"}, {"code": "2"}]
    with pytest.raises(ValueError, match="max_turns"):
        PythonToolEnv(max_turns=0)
    with pytest.raises(ValueError, match="backend"):
        PythonToolEnv(backend="none")
    with pytest.raises(ValueError, match="memory_mb"):
        PythonToolEnv(limits={"memory_mb": 1})
    with pytest.raises(ValueError, match="call_format"):
        PythonToolEnv(call_format="xml")


def test_parse_compact_tag_calls() -> None:
    assert parse_tag_calls("12") == []
    assert parse_tag_calls("<tool>print(1)</tool> <tool>2</tool>") == [{"code": "print(1)"}, {"code": "2"}]
    assert parse_tag_calls("<tool> </tool>") == [{"error": "the <tool> call is empty"}]
    assert parse_tag_calls("<tool>print(1)")[0]["error"].startswith("a <tool> was opened")


MULT = {
    "id": "m",
    "prompt": "4821*7390=",
    "answer": "35627190",
    "metadata": {"a": 4821, "op": "*", "b": 7390},
}


def test_compact_calls_and_the_expert_answer_from_what_the_sandbox_printed(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool, call_format="tag", tool_prompt="", answer_format="plain", max_turns=2)
    obs, _ = env.reset(options={"task": MULT})
    assert obs == "4821*7390="
    reply = env.expert_reply()
    assert reply == "<tool>print(4821*7390)</tool>"
    obs, r, term, _, info = env.step(reply)
    assert obs == "<tool_response>\n35627190\n</tool_response>" and not term and info["tool_calls"] == 1
    assert env.expert_reply() == "35627190"
    _, r, term, trunc, info = env.step(env.expert_reply())
    assert (r, term, trunc, info["tool_calls"]) == (1.0, True, False, 1)
    # the expert reads the tool output, never the gold answer: a wrong gold makes it lose
    env.reset(options={"task": {**MULT, "answer": "1"}})
    env.step(env.expert_reply())
    assert env.expert_reply() == "35627190"
    assert env.step(env.expert_reply())[1] == 0.0
    # a call in the JSON form is not a call in the compact form: graded as the final answer
    env.reset(options={"task": MULT})
    _, r, term, _, info = env.step(call("print(4821*7390)"))
    assert term and r == 0.0 and info["tool_calls"] == 0
    env.close()


def test_expert_in_the_json_form_and_boxed(backend, verifier_pool) -> None:
    env = make(backend, verifier_pool)
    env.reset(options={"task": MULT})
    reply = env.expert_reply()
    assert parse_tool_calls(reply) == [{"code": "print(4821*7390)"}]
    env.step(reply)
    assert env.expert_reply() == "\\boxed{35627190}"
    assert env.step(env.expert_reply())[1] == 1.0
    env.reset(options={"task": TASK})  # no expression in its metadata: the expert says what it needs
    with pytest.raises(ValueError, match="'expression' or 'a', 'op', 'b'"):
        env.expert_reply()
    env.close()
