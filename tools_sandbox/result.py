"""What a sandbox call returns, and the errors sandboxes raise."""

from __future__ import annotations

from dataclasses import dataclass

# status of a call:
#   ok         the code finished (exit code 0)
#   error      the code raised / exited non-zero
#   timeout    the hard deadline passed; the worker was killed
#   oom        the session ran out of memory; the worker was killed
#   pids       the session hit its process limit; the worker was killed
#   resources  the code exhausted another resource (file descriptors, ...); the worker was killed
#   crashed    the worker died (killed by a signal, os._exit, ...)
STATUSES = ("ok", "error", "timeout", "oom", "pids", "resources", "crashed")


@dataclass
class RunResult:
    """The outcome of one ``run_python`` / ``run_shell`` call.

    ``restarted`` is True when the call ended with the worker killed: the next call gets a fresh
    worker and the Python state (variables, imports, files in ``/work``) is gone.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    status: str = "ok"
    restarted: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """A one-line status an agent can read (empty for a plain success)."""
        if self.status == "ok":
            return ""
        if self.status == "error":
            return f"[exit code {self.exit_code}]"
        return {
            "timeout": (
                "[timed out: the call exceeded its deadline; the interpreter "
                "was restarted and its state lost]"
            ),
            "oom": "[out of memory: the interpreter was killed and restarted; its state was lost]",
            "pids": "[too many processes: the interpreter was killed and restarted; its state was lost]",
            "resources": "[resources exhausted: the interpreter was restarted; its state was lost]",
            "crashed": "[the interpreter died and was restarted; its state was lost]",
        }.get(self.status, f"[{self.status}]")


class SandboxError(RuntimeError):
    """A sandbox operation failed (file not found, worker refused a request, ...)."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run here; the message says how to get one."""


class SandboxTimeout(SandboxError):
    """A file operation passed its deadline (the worker was restarted)."""
