"""The repository passes ruff's lint (E501 on, at pyproject's line length) and its formatter.

Long lines hid a real bug once: a comment at the end of a long call swallowed two of its
arguments. With E501 on, a line past the limit is an error here, not a habit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_line_length_is_checked() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "E501" not in lint.get("ignore", []) and "E" in lint["select"]


def test_ruff_check_passes() -> None:
    out = _ruff("check", ".", "--no-cache")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    out = _ruff("format", "--check", ".", "--no-cache")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
