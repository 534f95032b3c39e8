"""Isolated code execution: Docker and bubblewrap sandboxes with a persistent Python worker.

::

    from tools_sandbox import open_sandbox, SandboxLimits
    with open_sandbox(backend="auto", limits=SandboxLimits()) as sb:   # or "docker" / "bwrap"
        # r.stdout r.stderr r.exit_code r.timed_out
        r = sb.run_python("x = 2\\nprint(x + 1)", timeout=5.0)
        sb.run_shell("ls", timeout=5.0); sb.write_file("a.txt", "hi"); sb.read_file("a.txt")

Modules: :mod:`.worker` (runs inside), :mod:`.session` (calls, deadlines, restarts), :mod:`.bwrap` and
:mod:`.docker_backend` (the backends), :mod:`.sealed` (verdicts the tested code cannot forge),
:mod:`.pool` (warm pool), :mod:`.reaper` (clean-up of leftovers), :mod:`.image` (offline image
build). This package imports nothing else of the project.
"""

from tools_sandbox.factory import backend_status, create_sandbox, open_sandbox, resolve_backend
from tools_sandbox.limits import SandboxLimits
from tools_sandbox.pool import SandboxPool, shared_pool
from tools_sandbox.result import RunResult, SandboxError, SandboxTimeout, SandboxUnavailable
from tools_sandbox.session import Sandbox, live_sessions

__all__ = [
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxTimeout",
    "SandboxUnavailable",
    "backend_status",
    "create_sandbox",
    "live_sessions",
    "open_sandbox",
    "resolve_backend",
    "shared_pool",
]
