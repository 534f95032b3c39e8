"""RepoCoding-v0: fix a bug in a real repository inside a sandbox, graded on hidden tests.

::

    env = gymnasium.make("fr_agents/RepoCoding-v0", tasks="DIR")   # DIR from `fr-agents repo-tasks build`
    obs, info = env.reset(seed=0)                                   # the issue text + how to call tools
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>')
    ...
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    info["partial_score"], info["won"]

Episode: ``reset`` copies the task's repository (``base_commit``: the bug, without the failing tests)
into a fresh sandbox (Docker when its daemon and image are there, else bubblewrap; pass
``backend=``). Each step runs the reply's tool calls (:mod:`.tools`) and returns their results in
``<tool_response>`` blocks. A reply without a tool call is answered with a reminder and uses a turn.
After ``submit`` (terminated) or ``max_turns`` replies (truncated) the agent's diff is graded in a
*fresh* sandbox (:func:`.grading.grade`): reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test
passes, ``info["partial_score"]`` = fraction of FAIL_TO_PASS passing x (1 if all PASS_TO_PASS pass
else 0.5). Edits to tests are discarded before grading. When grading (or the episode's sandbox)
cannot happen at all, ``reset``/``step`` raise :class:`~fr_agents.errors.InfrastructureFailure`
instead of returning a reward.

Branching: ``env.unwrapped.fork()`` copies the episode mid-way: the agent's working tree (its diff
against the base commit, new and binary files included) is applied in a new sandbox holding the
same base. ``env.unwrapped.partial_score()`` grades the current working tree the same way without
ending the episode; the episode runner calls it for a branch it cuts (turn or context budget).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, SupportsFloat

from envs.base import TextEnv
from envs.repo_coding.grading import collect_diff, grade, sandbox_limits, setup_repo
from envs.repo_coding.task import RepoTask, load_tasks
from envs.repo_coding.tools import EXAMPLE, RepoTools, parse_calls, tool_help
from fr_agents.errors import InfrastructureFailure

log = logging.getLogger(__name__)

INTRO = (
    "You are working in a Python repository at {workdir} inside a sandbox. Fix the issue below by "
    "editing the library code. Call tools with\n"
    '<tool_call>{{"name": TOOL, "arguments": {{...}}}}</tool_call>\n'
    "(one or more per reply); results come back in <tool_response>...</tool_response>. Tools:\n"
    "{tools}\nYou have {turns} replies. When you are done, call submit.\n\n# Issue\n\n{issue}\n"
)


def default_tasks_dir() -> Path:
    from envs.repo_coding.builder import default_cache_dir

    return default_cache_dir() / "tasks-seed-repos"


class RepoCodingEnv(TextEnv):
    """Repository-level coding in a sandbox (see the module docstring).

    Args:
        tasks: a task file/folder (JSONL or parquet, SWE-bench fields) or a list of
            :class:`~envs.repo_coding.task.RepoTask`. Default: the project's seed repositories,
            built on first use into the cache (a few seconds).
        backend: ``auto`` (Docker if available, else bubblewrap), ``docker`` or ``bwrap``.
        max_turns: replies per episode; the episode is graded (truncated) after the last one.
        max_tool_output_chars: each tool result is cut to this many characters.
        command_timeout: default deadline of one ``bash`` call, seconds.
        test_timeout: deadline of ``run_tests`` and of the grading test run, seconds.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        tasks: str | Path | list[RepoTask] | None = None,
        backend: str = "auto",
        max_turns: int = 30,
        max_tool_output_chars: int = 6000,
        command_timeout: float = 30.0,
        test_timeout: float = 180.0,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_tool_output_chars < 100:
            raise ValueError(f"max_tool_output_chars must be >= 100, got {max_tool_output_chars}")
        if tasks is None:
            from envs.repo_coding.builder import build_tasks

            tasks = build_tasks(default_tasks_dir(), seed=0, repos=["seed"])
        self.tasks = list(tasks) if isinstance(tasks, list) else load_tasks(tasks)
        if not self.tasks:
            raise ValueError("tasks: the task set is empty")
        self.backend = backend
        self.max_turns = max_turns
        self.max_tool_output_chars = max_tool_output_chars
        self.command_timeout = command_timeout
        self.test_timeout = test_timeout
        self.init_text(render_mode, 1 << 20)  # render_mode is not checked here (as before)
        self._sb: Any = None
        self._task: RepoTask | None = None
        self._base = ""
        self._turn = self._tool_calls = 0
        self.last_setup_seconds = 0.0

    @property
    def task(self) -> RepoTask | None:
        return self._task

    # ------------------------------------------------------------------ episode

    def _pick(self, options: dict[str, Any] | None) -> RepoTask:
        options = options or {}
        if isinstance(options.get("task"), dict):  # a task-source Task (training): its id is the instance_id
            options = {"task_id": options["task"]["id"]}
        if "task_id" in options:
            for t in self.tasks:
                if t.instance_id == options["task_id"]:
                    return t
            raise KeyError(f"options.task_id: no task {options['task_id']!r}")
        if "index" in options:
            return self.tasks[int(options["index"]) % len(self.tasks)]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._close_sandbox()
        task = self._pick(options)
        from tools_sandbox import SandboxError, open_sandbox

        t0 = time.monotonic()
        try:
            self._sb = open_sandbox(backend=self.backend, limits=sandbox_limits(), image=task.image)
        except (SandboxError, RuntimeError, OSError) as e:
            raise InfrastructureFailure("sandbox_start", f"{type(e).__name__}: {e}") from e
        try:
            self._base = setup_repo(self._sb, task)
        except (SandboxError, RuntimeError) as e:
            self._close_sandbox()
            raise InfrastructureFailure("sandbox_setup", f"{type(e).__name__}: {e}") from e
        except BaseException:
            self._close_sandbox()
            raise
        self.last_setup_seconds = time.monotonic() - t0
        self._task = task
        self._turn = self._tool_calls = 0
        self._done = False
        obs = INTRO.format(
            workdir=task.workdir, tools=tool_help(), turns=self.max_turns, issue=task.problem_statement
        )
        self._transcript = [("task", obs)]
        return obs, {
            "instance_id": task.instance_id,
            "setup_seconds": self.last_setup_seconds,
            "tool_calls": 0,
        }

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action: expected the model's reply as a str, got {type(action).__name__}")
        self.ensure_running(ready=self._task is not None)
        self._turn += 1
        self._transcript.append(("agent", action))
        tools = RepoTools(
            self._sb, self._task, self.max_tool_output_chars, self.command_timeout, self.test_timeout
        )
        responses: list[str] = []
        submitted = False
        calls = parse_calls(action)
        for call in calls:
            if "error" in call:
                body = f"Error: {call['error']}. A call looks like {EXAMPLE}"
            elif call["name"] == "submit":
                submitted = True
                break
            else:
                self._tool_calls += 1
                body = tools.call(call["name"], call["arguments"])
            responses.append(f"<tool_response>\n{body}\n</tool_response>")
        if not calls:
            responses.append(
                f"<tool_response>\nNo tool call found. Use {EXAMPLE}, and submit when done.\n</tool_response>"
            )
        if submitted or self._turn >= self.max_turns:
            return self._finish(truncated=not submitted)
        obs = "\n".join(responses)
        self._transcript.append(("tool", obs))
        return obs, 0.0, False, False, {"turn": self._turn, "tool_calls": self._tool_calls}

    def _finish(self, truncated: bool) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        assert self._task is not None
        try:
            diff, err = collect_diff(self._sb, self._task, self._base)
        except Exception as e:  # noqa: BLE001 - a wrecked sandbox grades as no change
            diff, err = "", f"could not read the agent's changes: {e}"
        self._close_sandbox()
        self._done = True
        result = grade(self._task, diff, backend=self.backend, test_timeout=self.test_timeout)
        if err and not result.error:
            result.error = err
        info = {
            **result.as_info(),
            "partial_score": result.partial_score,
            "won": result.reward == 1.0,
            "turn": self._turn,
            "tool_calls": self._tool_calls,
            "instance_id": self._task.instance_id,
            "diff": diff,
        }
        return "", result.reward, not truncated, truncated, info

    # ------------------------------------------------------------------ branching

    def fork(self) -> RepoCodingEnv:
        """An independent copy mid-episode: same task, turn and counters, in its own sandbox holding
        this episode's working tree (the diff against the base commit, applied to the same base)."""
        import copy

        from tools_sandbox import open_sandbox

        if self._done or self._task is None or self._sb is None:
            raise RuntimeError("fork() needs an episode in progress")
        task = self._task
        diff, err = collect_diff(self._sb, task, self._base)
        if err:
            raise RuntimeError(f"fork: {err}")
        twin = copy.copy(self)
        twin._transcript = list(self._transcript)
        twin._sb = open_sandbox(backend=self.backend, limits=sandbox_limits(), image=task.image)
        try:
            twin._base = setup_repo(twin._sb, task)
            if diff.strip():
                twin._sb.write_file("/tmp/fr_fork.diff", diff)
                r = twin._sb.run_shell(
                    f"cd {task.workdir} && git apply --whitespace=nowarn /tmp/fr_fork.diff", timeout=60
                )
                if r.exit_code != 0:
                    raise RuntimeError(
                        f"fork: the working tree does not re-apply: {(r.stderr or r.stdout)[-300:]}"
                    )
        except BaseException:
            twin._close_sandbox()
            raise
        return twin

    def partial_score(self) -> float:
        """The grade's partial score of the current working tree, without ending the episode."""
        if self._task is None or self._sb is None:
            return 0.0
        diff, _ = collect_diff(self._sb, self._task, self._base)
        return grade(self._task, diff, backend=self.backend, test_timeout=self.test_timeout).partial_score

    # ------------------------------------------------------------------ plumbing

    def _close_sandbox(self) -> None:
        if self._sb is not None:
            try:
                self._sb.close()
            finally:
                self._sb = None

    def release(self) -> None:
        self._close_sandbox()
