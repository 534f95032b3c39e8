"""Which of the agent's edits the grader keeps: tests, pytest's configuration and compiled or
package files are protected, and the blocks of the agent's diff that touch them are dropped before
grading (:func:`filter_diff`), so a candidate cannot pass by editing what judges it::

    >>> is_protected_path("pkg/tests/test_core.py"), is_protected_path("pkg/core.py")
    (True, False)
"""

from __future__ import annotations

import shlex
from pathlib import Path

from envs.repo_coding.testrun import PLUGIN_MODULE

# Files whose edits are discarded before grading: tests and anything that configures pytest.
_CONFIG_NAMES = {
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
    PLUGIN_MODULE + ".py",
}
_TEST_DIRS = {"test", "tests", "testing"}
# Compiled or installed-package files: a planted .pyc (pytest reads rewritten test modules from
# __pycache__ even when it writes none) or package metadata (entry points) is never the agent's fix.
_BUILD_DIRS = {"__pycache__"}
_BUILD_SUFFIXES = (".pyc", ".pyo", ".pth", ".dist-info", ".egg-info")


def is_protected_path(path: str) -> bool:
    """True for test files, pytest configuration and compiled/package files: the grader discards
    the agent's changes to them.

    Protected: ``test_*.py``, ``*_test.py``, anything under a ``test/``, ``tests/`` or ``testing/``
    folder, every file pytest reads configuration from (``pytest.ini``, ``.pytest.ini``, ``tox.ini``,
    ``setup.cfg``, ``pyproject.toml``, ``conftest.py`` at any depth), ``sitecustomize.py``,
    ``usercustomize.py``, and anything under ``__pycache__/``, ending in ``.pyc``/``.pyo``/``.pth`` or
    inside ``*.dist-info``/``*.egg-info``.
    """
    parts = Path(path).parts
    name = parts[-1] if parts else path
    if name in _CONFIG_NAMES or any(p in _TEST_DIRS for p in parts[:-1]):
        return True
    if any(p in _BUILD_DIRS or p.endswith(_BUILD_SUFFIXES) for p in parts):
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
