"""The agent's tools in a repository sandbox, and the parser for their calls.

Calls use the Hermes/Qwen format of PythonTool-v0, one JSON object per call::

    <tool_call>{"name": "str_replace",
                "arguments": {"path": "pkg/mod.py", "old_str": "a", "new_str": "b"}}</tool_call>

Tools: ``bash(command, timeout?)``, ``read_file(path, start_line?, end_line?)``,
``write_file(path, content)``, ``str_replace(path, old_str, new_str)``, ``run_tests(paths?)`` (the
visible tests only: the hidden ones are not in the checkout) and ``submit()``. Relative paths are
inside the repository. Every result is cut to a character budget (head and tail kept).
"""

from __future__ import annotations

import shlex
from typing import Any

from envs.repo_coding.task import RepoTask
from envs.tool_calls import parse_tool_calls

TOOLS: dict[str, dict[str, Any]] = {
    "bash": {
        "required": ["command"],
        "doc": "run a shell command in the repository (optional timeout, seconds)",
    },
    "read_file": {"required": ["path"], "doc": "show a file (optional start_line / end_line, 1-based)"},
    "write_file": {"required": ["path", "content"], "doc": "create or overwrite a file"},
    "str_replace": {
        "required": ["path", "old_str", "new_str"],
        "doc": "replace the one occurrence of old_str in a file by new_str",
    },
    "run_tests": {
        "required": [],
        "doc": "run the repository's visible tests (optional paths: list of test files)",
    },
    "submit": {"required": [], "doc": "finish: your changes are graded on hidden tests"},
}
EXAMPLE = '<tool_call>{"name": "read_file", "arguments": {"path": "README.rst"}}</tool_call>'


def tool_help() -> str:
    return "\n".join(f"- {name}: {spec['doc']}" for name, spec in TOOLS.items())


def parse_calls(text: str) -> list[dict[str, Any]]:
    """Every ``<tool_call>`` in ``text``: ``{"name", "arguments"}`` or ``{"error": why}``."""
    return parse_tool_calls(text, _check_call)


def _check_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name not in TOOLS:
        return {"error": f"unknown tool {name!r}; tools: {', '.join(TOOLS)}"}
    missing = [k for k in TOOLS[name]["required"] if not isinstance(args.get(k), str)]
    if missing:
        return {"error": f"{name}: missing string argument(s) {', '.join(missing)}"}
    return {"name": name, "arguments": args}


def cap(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars``: the head and the tail survive, the middle is marked as cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters cut ...]\n{text[-tail:]}"


class RepoTools:
    """Executes tool calls against the repository in one sandbox."""

    def __init__(
        self,
        sb: Any,
        task: RepoTask,
        max_chars: int = 6000,
        command_timeout: float = 30.0,
        test_timeout: float = 180.0,
    ) -> None:
        self.sb, self.task = sb, task
        self.max_chars, self.command_timeout, self.test_timeout = max_chars, command_timeout, test_timeout

    def path(self, p: str) -> str:
        return p if p.startswith("/") else f"{self.task.workdir.rstrip('/')}/{p}"

    def call(self, name: str, args: dict[str, Any]) -> str:
        """The text result of one call (errors are reported as text, never raised)."""
        from tools_sandbox import SandboxError

        try:
            return cap(getattr(self, f"_{name}")(args), self.max_chars)
        except SandboxError as e:
            return f"Error: {e}"
        except (TypeError, ValueError) as e:
            return f"Error: {name}: {e}"

    def _shell(self, cmd: str, timeout: float) -> str:
        r = self.sb.run_shell(f"cd {shlex.quote(self.task.workdir)} && {cmd}", timeout=timeout)
        parts = [r.stdout.rstrip("\n"), r.stderr.rstrip("\n")]
        text = "\n".join(p for p in parts if p)
        if r.timed_out:
            text += f"\n[timed out after {timeout:g}s]"
        elif r.exit_code:
            text += f"\n[exit code {r.exit_code}]"
        return text.strip("\n") or "(no output)"

    def _bash(self, a: dict[str, Any]) -> str:
        timeout = float(a.get("timeout") or self.command_timeout)
        return self._shell(a["command"], max(1.0, min(timeout, self.command_timeout * 4)))

    def _read_file(self, a: dict[str, Any]) -> str:
        text = self.sb.read_file(self.path(a["path"])).decode("utf-8", errors="replace")
        lines = text.splitlines()
        start = int(a.get("start_line") or 1)
        end = int(a.get("end_line") or len(lines))
        if start < 1 or end < start - 1:
            raise ValueError("start_line must be >= 1 and end_line >= start_line")
        numbered = [f"{i:5d}  {lines[i - 1]}" for i in range(start, min(end, len(lines)) + 1)]
        return "\n".join(numbered) if numbered else "(empty range)"

    def _write_file(self, a: dict[str, Any]) -> str:
        self.sb.write_file(self.path(a["path"]), a["content"])
        return f"wrote {len(a['content'])} characters to {a['path']}"

    def _str_replace(self, a: dict[str, Any]) -> str:
        path = self.path(a["path"])
        text = self.sb.read_file(path).decode("utf-8")
        n = text.count(a["old_str"]) if a["old_str"] else 0
        if n != 1:
            return f"Error: old_str must occur exactly once in {a['path']} (found {n} times); nothing changed"
        self.sb.write_file(path, text.replace(a["old_str"], a["new_str"], 1))
        return f"replaced 1 occurrence in {a['path']}"

    def _run_tests(self, a: dict[str, Any]) -> str:
        """pytest's output from the sealed runner the grader uses (a shadowed pytest or an early exit is
        reported, not trusted), on the visible tests as they are in the checkout. Grading runs the
        hidden tests with its checks rewritten and compared with the reference implementation's
        (:mod:`envs.repo_coding.checks`)."""
        from envs.repo_coding.testrun import run_pytest

        paths = a.get("paths") or self.task.visible_test_files
        if isinstance(paths, str):
            paths = paths.split()
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError("paths must be a list of test file paths")
        run = run_pytest(self.sb, self.task.workdir, list(paths), self.test_timeout)
        text = run.output or "(no output)"
        if run.timed_out:
            text += f"\n[timed out after {self.test_timeout:g}s]"
        elif not run.trusted:
            text += (
                "\n[the test run did not finish with a sealed report: grading would count no test as passed]"
            )
        return text
