"""``fr_agents/HumanEval-v0``: canonical solutions pass, empty completions fail, replies run in a sandbox.

A subset of problems keeps the default run short (each attempt starts a fresh sandbox session); the
full 164-problem check through the eval runner is marked ``slow``.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401  (registers the ids)
from envs.humaneval import build_program, humaneval_tasks
from fr_agents.errors import InfrastructureFailure
from fr_agents.eval import EvalSettings, run_bench
from fr_agents.policy.base import Engine, Generation, SamplingOptions
from tools_sandbox import backend_status

if not any(ok for ok, _ in backend_status().values()):
    pytest.skip(f"no sandbox backend: {backend_status()}", allow_module_level=True)
BWRAP = backend_status()["bwrap"][0]

SUBSET = [
    "HumanEval/0",
    "HumanEval/2",
    "HumanEval/10",
    "HumanEval/32",
    "HumanEval/38",
]  # 10, 38: helper functions


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, Any]]:
    return {t["id"]: dict(t) for t in humaneval_tasks()}


def attempt(task: dict[str, Any], reply: str, **kw: Any) -> tuple[float, dict[str, Any]]:
    env = gymnasium.make("fr_agents/HumanEval-v0", **kw)
    try:
        obs, info = env.reset(options={"task": task})
        assert task["prompt"] in obs and info["task_id"] == task["id"]
        _obs, reward, terminated, truncated, info = env.step(reply)
        assert terminated and not truncated
        return float(reward), info
    finally:
        env.close()


def test_the_package_data_loads_as_164_tasks(tasks: dict[str, dict[str, Any]]) -> None:
    assert len(tasks) == 164
    t = tasks["HumanEval/0"]
    assert (
        t["metadata"]["entry_point"] == "has_close_elements"
        and "def check(candidate)" in t["metadata"]["test"]
    )


@pytest.mark.parametrize("task_id", SUBSET)
def test_canonical_solution_passes_and_empty_completion_fails(
    tasks: dict[str, dict[str, Any]], task_id: str
) -> None:
    reward, info = attempt(tasks[task_id], tasks[task_id]["answer"])
    assert reward == 1.0 and info["won"] and info["reason"] == "passed", info
    reward, info = attempt(tasks[task_id], "")
    assert reward == 0.0 and not info["won"] and info["reason"] == "failed", info


def test_a_whole_function_in_a_fenced_block_is_accepted(tasks: dict[str, dict[str, Any]]) -> None:
    reply = (
        "Here you go:\n```python\n"
        + textwrap.dedent(
            """\
        def has_close_elements(numbers, threshold):
            return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])
        """
        )
        + "```\nThat should work."
    )
    assert attempt(tasks["HumanEval/0"], reply)[0] == 1.0
    wrong = reply.replace("< threshold", "> threshold")
    assert attempt(tasks["HumanEval/0"], wrong)[0] == 0.0


def test_broken_and_hanging_replies_score_zero_with_a_reason(tasks: dict[str, dict[str, Any]]) -> None:
    reward, info = attempt(tasks["HumanEval/2"], "    return (((\n")
    assert reward == 0.0 and info["reason"] == "failed" and "SyntaxError" in info["stderr"]
    reward, info = attempt(tasks["HumanEval/2"], "    while True:\n        pass\n", timeout=2.0)
    assert reward == 0.0 and info["reason"] == "timeout"


def test_build_program_keeps_prompt_helpers_when_the_reply_redefines_the_function(
    tasks: dict[str, dict[str, Any]],
) -> None:
    t = tasks["HumanEval/10"]  # the prompt defines is_palindrome before make_palindrome
    program = build_program(
        t["prompt"], "def make_palindrome(string: str) -> str:\n    return string\n", "", "make_palindrome"
    )
    assert "def is_palindrome" in program and program.rstrip().endswith("check(make_palindrome)")
    compile(program.replace("check(make_palindrome)", ""), "<p>", "exec")


def test_env_checker_and_bad_input() -> None:
    env = gymnasium.make("fr_agents/HumanEval-v0")
    check_env(env.unwrapped, skip_render_check=True)
    with pytest.raises(ValueError, match=r'\["metadata"\]\["test"\]'):
        env.reset(options={"task": {"prompt": "def f():\n", "answer": ""}})
    env.close()
    with pytest.raises(ValueError, match="timeout"):
        gymnasium.make("fr_agents/HumanEval-v0", timeout=0)


class ScriptedEngine(Engine):
    """Replies to each HumanEval prompt with a fixed text per task (canonical, or empty)."""

    def __init__(self, tokenizer: Any, replies: dict[str, str]) -> None:
        self.tok = tokenizer
        self.replies = replies
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
        prompt = max((p for p in self.replies if p in text), key=len)
        ids = self.tok.encode(self.replies[prompt], add_special_tokens=False) + [self.end]
        return Generation(ids, [0.0] * len(ids), self.version, "stop")

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise NotImplementedError


def run_humaneval(tmp_path: Path, limit: int | None, reply: str) -> Any:
    from transformers import AutoTokenizer

    from envs.benches import resolve_bench
    from fr_agents.models import tiny_dir

    tok = AutoTokenizer.from_pretrained(tiny_dir("nano"))
    bench = resolve_bench("humaneval", limit)
    replies = {
        it.options["task"]["prompt"]: (it.options["task"]["answer"] if reply == "canonical" else "")
        for it in bench.items
    }
    settings = EvalSettings(k=1, temperature=1.0, max_context=1 << 15, concurrency=8)
    return run_bench(ScriptedEngine(tok, replies), tok, bench, settings, label=reply, out_dir=tmp_path)


def test_bench_pass_at_1_is_one_for_canonical_and_zero_for_empty(tmp_path: Path) -> None:
    good = run_humaneval(tmp_path, 4, "canonical")
    assert good.primary == "pass@k" and good.tasks == 4
    assert good.metrics["pass@1"] == 1.0 and good.headline == 1.0
    empty = run_humaneval(tmp_path, 4, "empty")
    assert empty.metrics["pass@1"] == 0.0
    row = json.loads(Path(empty.samples_file).read_text().splitlines()[0])
    assert row["env_info"]["reason"] == "failed" and row["actions"] == [""]


@pytest.mark.slow
def test_full_humaneval_canonical_is_one_and_empty_is_zero(tmp_path: Path) -> None:
    assert run_humaneval(tmp_path, None, "canonical").metrics["pass@1"] == 1.0
    assert run_humaneval(tmp_path, None, "empty").metrics["pass@1"] == 0.0


# ----------------------------------------------------------------------------- infrastructure failures
# Grading that could not happen raises InfrastructureFailure from step (the rollout stores the leaf
# aborted); it is never a reward 0, which would teach the policy that correct work is wrong.


def given_task(test: str) -> dict[str, Any]:
    return {
        "id": "given",
        "prompt": "def f(x):\n",
        "answer": "    return x\n",
        "metadata": {"test": test, "entry_point": "f"},
    }


def step_raises(task: dict[str, Any], reply: str) -> InfrastructureFailure:
    env = gymnasium.make("fr_agents/HumanEval-v0", backend="bwrap" if BWRAP else "docker").unwrapped
    try:
        env.reset(options={"task": task})
        with pytest.raises(InfrastructureFailure) as e:
            env.step(reply)
        return e.value
    finally:
        env.close()


def test_a_sandbox_that_does_not_start_is_an_infrastructure_failure(monkeypatch, tasks) -> None:
    import tools_sandbox

    def no_start(*a: Any, **k: Any) -> Any:
        raise tools_sandbox.SandboxError("the worker did not start")

    monkeypatch.setattr(tools_sandbox, "open_sandbox", no_start)
    failure = step_raises(tasks["HumanEval/0"], tasks["HumanEval/0"]["answer"])
    assert failure.reason == "sandbox_start" and "did not start" in str(failure)


def test_a_sandbox_that_does_not_come_back_after_a_crash_is_an_infrastructure_failure(
    monkeypatch, tasks
) -> None:
    """A worker that dies mid-call is normally the program's doing (reason ``crashed``); when no fresh
    worker starts afterwards, the sandbox itself is broken."""
    import tools_sandbox

    real_open = tools_sandbox.open_sandbox

    def open_then_break(*a: Any, **k: Any) -> Any:
        sb = real_open(*a, **k)

        def no_restart() -> Any:
            raise tools_sandbox.SandboxError("the backend is gone")

        sb.start = no_restart
        return sb

    reply = "    import os\n    os._exit(0)\n"
    task = tasks["HumanEval/0"]
    reward, info = attempt(task, reply, backend="bwrap" if BWRAP else "docker")
    assert reward == 0.0 and info["reason"] == "crashed", info  # the program's own crash
    monkeypatch.setattr(tools_sandbox, "open_sandbox", open_then_break)
    assert step_raises(task, reply).reason == "sandbox_died"


@pytest.mark.parametrize(
    "test",
    [
        "def check(candidate):\n    assert candidate(1) == helper(1)\n",  # a name the test lacks
        "def check(candidate):\n    assert candidate(1) ==\n",  # does not compile
        "def check(candidate):\n    assert candidate(object()) is None\n",  # a non-plain argument
        "def check(candidate):\n    assert candidate(x=1) == 1\n",  # keyword arguments
        "def test(candidate):\n    pass\n",  # no check()
    ],
    ids=["name_error", "syntax_error", "non_plain_argument", "keyword_argument", "no_check"],
)
def test_a_broken_test_is_an_infrastructure_failure(test: str) -> None:
    failure = step_raises(given_task(test), "    return x\n")
    assert failure.reason == "checker", failure


def test_a_checker_process_that_dies_is_an_infrastructure_failure(monkeypatch, tmp_path: Path, tasks) -> None:
    import envs.humaneval as he

    script = tmp_path / "dies.py"
    script.write_text("import os\nos._exit(3)\n")
    monkeypatch.setattr(he, "CHECKER_SCRIPT", script)
    assert step_raises(tasks["HumanEval/0"], tasks["HumanEval/0"]["answer"]).reason == "checker"


def test_after_an_infrastructure_failure_the_episode_can_be_graded_again(monkeypatch, tasks) -> None:
    import tools_sandbox

    env = gymnasium.make("fr_agents/HumanEval-v0", backend="bwrap" if BWRAP else "docker").unwrapped
    try:
        env.reset(options={"task": tasks["HumanEval/2"]})
        with monkeypatch.context() as m:
            m.setattr(
                tools_sandbox,
                "open_sandbox",
                lambda *a, **k: (_ for _ in ()).throw(tools_sandbox.SandboxError("x")),
            )
            with pytest.raises(InfrastructureFailure):
                env.step(tasks["HumanEval/2"]["answer"])
        assert env.step(tasks["HumanEval/2"]["answer"])[1] == 1.0
    finally:
        env.close()


def test_a_program_that_prints_still_passes_and_its_return_types_are_kept(tasks) -> None:
    """The function's own prints go to stderr, not into the value; tuples stay tuples (a test
    comparing with a tuple passes only with one)."""
    reply = "    print('debug', numbers, flush=True)\n" + tasks["HumanEval/0"]["answer"]
    assert attempt(tasks["HumanEval/0"], reply)[0] == 1.0
    t8 = tasks["HumanEval/8"]  # sum_product returns a tuple
    assert attempt(t8, t8["answer"])[0] == 1.0
    as_list = "    return [sum(numbers), __import__('math').prod(numbers)]\n"
    assert attempt(t8, as_list)[0] == 0.0
