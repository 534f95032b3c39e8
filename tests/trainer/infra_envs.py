"""A test env graded in a real sandbox, whose sandbox the test can kill in the middle of grading.

``fr_agents_test/SandboxGraded-v0`` (importable as ``infra_envs:fr_agents_test/SandboxGraded-v0``)
takes the arithmetic tasks of math-tiny. Its grader is trusted code that runs in a real sandbox
(:func:`tools_sandbox.create_sandbox`, bwrap): the reply goes in only as a string literal, and the
program compares it with the gold answer and prints 1 or 0. The reply runs nothing, so a sandbox
that dies while the grader's program runs is the infrastructure's failure, never the reply's: the
env raises :class:`~fr_agents.errors.InfrastructureFailure` (``sandbox_died``) instead of a reward.

The kill is real: for the first ``kills`` grades (``-1``: every grade) a thread sends SIGKILL to the
sandbox's bwrap process while the grader's program runs. Each kill takes a ticket file in
``ticket_dir`` (``O_EXCL``), so the count holds across threads and processes. ``kill_in`` says what
is killed: ``grade`` (the final grade), ``partial`` (``partial_score()``, which grades a branch the
rollout cut) or ``fork`` (the health check of the fresh sandbox ``fork()`` opens: it then fails to
start, ``sandbox_start``). With ``turns`` > 1 the replies before the last are not graded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium

from fr_agents.errors import InfrastructureFailure
from fr_agents.spaces import AnyText
from tools_sandbox import SandboxLimits, create_sandbox

GRADE_SECONDS = 1.5  # the grader's program runs this long, so a kill lands in the middle of it
KILL_AFTER = 0.3


def sandbox_pids(label: str) -> list[int]:
    """Host pids of the processes whose command line names the sandbox ``label`` (bwrap's
    ``--hostname``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if label.encode() in argv:
                pids.append(int(entry.name))
    return pids


class SandboxGradedEnv(gymnasium.Env):
    """One reply per task, graded by a program in a real sandbox (see the module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}
    grades = 0  # grader programs this process ran to the end
    killed = 0  # sandboxes this process killed mid-grade

    def __init__(
        self,
        kills: int = 0,
        ticket_dir: str = "",
        backend: str = "bwrap",
        kill_in: str = "grade",
        turns: int = 1,
    ) -> None:
        self.observation_space, self.action_space = AnyText(4096), AnyText(65536)
        self.kills, self.ticket_dir, self.backend = int(kills), ticket_dir, backend
        self.kill_in, self.turns = kill_in, int(turns)
        self.task: dict[str, Any] | None = None
        self.sandbox: Any = None
        self.t = 0
        self.last = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.task = dict((options or {})["task"])
        self.t, self.last = 0, ""
        self.close()
        self._open(check="pass")
        return self.task["prompt"], {}

    def _open(self, check: str, where: str = "reset") -> None:
        """A fresh sandbox whose worker runs ``check`` before it is used (its health check)."""
        self.sandbox = create_sandbox(self.backend, SandboxLimits())
        killer = self._kill_soon() if self._ticket(where) else None
        r = self.sandbox.run_python(check, timeout=30)
        if killer is not None:
            killer.join()
        if r.status != "ok":
            self.close()
            raise InfrastructureFailure("sandbox_start", f"the sandbox's health check ended {r.status!r}")

    def fork(self) -> SandboxGradedEnv:
        """A twin at the same turn, in a sandbox of its own."""
        twin = SandboxGradedEnv(self.kills, self.ticket_dir, self.backend, self.kill_in, self.turns)
        twin.task, twin.t, twin.last = self.task, self.t, self.last
        twin._open(f"import time\ntime.sleep({GRADE_SECONDS})" if self.kill_in == "fork" else "pass", "fork")
        return twin

    def _ticket(self, where: str) -> bool:
        """Whether this ``where`` (grade, partial, fork) is one of the ``kills`` to kill."""
        if where != self.kill_in:
            return False
        if self.kills < 0:
            return True
        for i in range(self.kills):
            try:
                os.close(
                    os.open(os.path.join(self.ticket_dir, f"kill{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                )
                return True
            except FileExistsError:
                continue
        return False

    def _kill_soon(self) -> threading.Thread:
        label = self.sandbox.label

        def kill() -> None:
            time.sleep(KILL_AFTER)
            for pid in sandbox_pids(label):
                with contextlib.suppress(ProcessLookupError):  # it may be gone already
                    os.kill(pid, signal.SIGKILL)
            type(self).killed += 1

        thread = threading.Thread(target=kill, name="sandbox-killer", daemon=True)
        thread.start()
        return thread

    def _grade(self, reply: str, where: str) -> float:
        assert self.task is not None and self.sandbox is not None
        killer = self._kill_soon() if self._ticket(where) else None
        program = (
            f"import time\ntime.sleep({GRADE_SECONDS})\n"
            f"reply, gold = {reply!r}, {str(self.task['answer'])!r}\n"
            "print(int(reply.strip() == gold))\n"
        )
        r = self.sandbox.run_python(program, timeout=30)
        if killer is not None:
            killer.join()
        if r.status != "ok":  # the grader's own program did not finish: no verdict on the reply
            raise InfrastructureFailure("sandbox_died", f"the grading sandbox ended {r.status!r} mid-grade")
        type(self).grades += 1
        return float(r.stdout.strip() == "1")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.t += 1
        self.last = action
        if self.t < self.turns:
            return f"Reply {self.t} noted; answer again.", 0.0, False, False, {}
        reward = self._grade(action, "grade")
        return "", reward, True, False, {"correct": bool(reward)}

    def partial_score(self) -> float:
        """A branch the rollout cut: its last reply, graded like a final one."""
        return self._grade(self.last, "partial")

    def close(self) -> None:
        if self.sandbox is not None:
            sb, self.sandbox = self.sandbox, None
            sb.close()


if "fr_agents_test/SandboxGraded-v0" not in gymnasium.registry:
    gymnasium.register(
        id="fr_agents_test/SandboxGraded-v0",
        entry_point="infra_envs:SandboxGradedEnv",
        disable_env_checker=True,
    )
