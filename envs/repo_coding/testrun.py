"""Running pytest and reading its per-test outcomes, the same way on the host and in a sandbox.

Outcomes come from a tiny pytest plugin (:data:`REPORT_PLUGIN`) that writes one JSON object,
``{node id: {"outcome": "passed"|"failed"|"skipped", "message": str}}``, at the end of the session.
That is exact (no parsing of pytest's text output) and works with pytest 7 (the sandbox image's
``python3-pytest``) and newer. Plugin auto-loading is switched off and ``addopts`` emptied so that a
repository's own pytest configuration (coverage flags, plugins) cannot break or fake a run.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

PLUGIN_MODULE = "_fr_report"

REPORT_PLUGIN = '''\
"""fr-agents: record every test's outcome to $FR_REPORT_PATH as JSON."""
import json
import os

_results = {}


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr or "")[-400:]


def pytest_runtest_logreport(report):
    prev = _results.get(report.nodeid)
    if report.failed:
        if prev is None or prev["outcome"] != "failed":
            _results[report.nodeid] = {"outcome": "failed", "message": _message(report)[:1000]}
    elif prev is not None and prev["outcome"] == "failed":
        return
    elif report.when == "call":
        outcome = "skipped" if (report.skipped or hasattr(report, "wasxfail")) else "passed"
        _results[report.nodeid] = {"outcome": outcome, "message": ""}
    elif report.skipped:
        _results[report.nodeid] = {"outcome": "skipped", "message": ""}


def pytest_collectreport(report):
    if report.failed:
        _results["<collect>::" + report.nodeid] = {"outcome": "failed", "message": _message(report)[:1000]}


_lines = {}
_traced = {}


def _local(frame, event, arg):
    if event == "line":
        _lines[_traced[frame.f_code.co_filename]].add(frame.f_lineno)
    return _local


def _global(frame, event, arg):
    name = frame.f_code.co_filename
    if name not in _traced:
        rel = os.path.relpath(os.path.abspath(name))
        _traced[name] = rel if rel in _lines else None
    if _traced[name] is None:
        return None
    _lines[_traced[name]].add(frame.f_lineno)
    return _local


def pytest_configure(config):
    # FR_TRACE_FILES (builder only): record which lines of these files the tests execute.
    files = os.environ.get("FR_TRACE_FILES")
    if files:
        import sys
        import threading

        for f in files.split(os.pathsep):
            _lines[os.path.normpath(f)] = set()
        sys.settrace(_global)
        threading.settrace(_global)


def pytest_sessionfinish(session, exitstatus):
    if _lines:
        _results["<lines>"] = {"outcome": "trace", "files": {k: sorted(v) for k, v in _lines.items()}}
    with open(os.environ["FR_REPORT_PATH"], "w") as f:
        json.dump(_results, f)
'''

# Files whose edits are discarded before grading: tests and anything that configures pytest.
_CONFIG_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                 "usercustomize.py", PLUGIN_MODULE + ".py"}
_TEST_DIRS = {"test", "tests", "testing"}


def is_protected_path(path: str) -> bool:
    """True for test files and pytest configuration: the grader discards the agent's changes to them.

    Protected: ``test_*.py``, ``*_test.py``, anything under a ``test/``, ``tests/`` or ``testing/``
    folder, ``conftest.py``, ``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``,
    ``sitecustomize.py`` and ``usercustomize.py``.
    """
    parts = Path(path).parts
    name = parts[-1] if parts else path
    if name in _CONFIG_NAMES or any(p in _TEST_DIRS for p in parts[:-1]):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _diff_paths(header: str) -> list[str]:
    """The two paths of a ``diff --git a/X b/Y`` header line."""
    rest = header[len("diff --git ") :].strip()
    try:
        parts = shlex.split(rest)
    except ValueError:
        parts = rest.split(" ")
    out = []
    for p in parts[:2]:
        out.append(p[2:] if p[:2] in ("a/", "b/") else p)
    return out


def split_diff(diff: str) -> list[tuple[list[str], str]]:
    """A git diff cut into per-file blocks: ``[(paths, text), ...]``."""
    blocks: list[tuple[list[str], str]] = []
    cur: list[str] = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            if cur:
                blocks.append((_diff_paths(cur[0]), "".join(cur)))
            cur = [line]
        elif cur:
            cur.append(line)
    if cur:
        blocks.append((_diff_paths(cur[0]), "".join(cur)))
    return blocks


def filter_diff(diff: str) -> tuple[str, list[str]]:
    """Drop the blocks of ``diff`` that touch protected paths; returns (kept diff, dropped paths)."""
    kept, dropped = [], []
    for paths, text in split_diff(diff):
        if any(is_protected_path(p) for p in paths):
            dropped.append(paths[-1])
        else:
            kept.append(text)
    return "".join(kept), dropped


def pytest_shell(
    files: list[str], report_path: str, plugin_dir: str, python: str = "python3", trace: list[str] | None = None
) -> str:
    """The shell command (run in the repository root) that tests ``files`` and writes the report;
    ``trace`` (builder only) also records the executed lines of those source files."""
    env = (
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 "
        f"PYTHONPATH={shlex.quote(plugin_dir)}:. FR_REPORT_PATH={shlex.quote(report_path)}"
    )
    if trace:
        env += f" FR_TRACE_FILES={shlex.quote(':'.join(trace))}"
    targets = " ".join(shlex.quote(f) for f in files)
    return (
        f"{env} {shlex.quote(python)} -m pytest -q -p {PLUGIN_MODULE} -p no:cacheprovider "
        f"--tb=short -o addopts= -o console_output_style=classic {targets}"
    )


def parse_report(text: str | bytes) -> dict[str, dict[str, str]]:
    """The plugin's JSON report as ``{node id: {"outcome", "message"}}``."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the pytest report is not a JSON object")
    return data


def passed_ids(report: dict[str, dict[str, str]]) -> set[str]:
    return {nid for nid, r in report.items() if r.get("outcome") == "passed"}


def partial_score(f2p_passed: int, f2p_total: int, p2p_all_pass: bool) -> float:
    """The partial-progress score of a graded attempt.

    ``partial_score = (FAIL_TO_PASS passing / FAIL_TO_PASS total) * (1.0 if every PASS_TO_PASS
    passes else 0.5)``: progress on the bug counts fully only when nothing that worked was broken.
    """
    if f2p_total <= 0:
        raise ValueError("f2p_total must be positive")
    return (f2p_passed / f2p_total) * (1.0 if p2p_all_pass else 0.5)
