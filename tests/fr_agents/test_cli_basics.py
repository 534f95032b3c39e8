"""The CLI frame: help lists subcommands, doctor reports one line per component."""

from __future__ import annotations

import json
import subprocess
import sys

from fr_agents.cli import main


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fr_agents.cli", *argv], capture_output=True, text=True, timeout=120
    )


def test_help_lists_subcommands() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for name in ("doctor", "envs", "train"):
        assert name in out.stdout


def test_doctor_one_line_per_component(capsys) -> None:
    assert main(["doctor"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    names = (
        "torch",
        "transformers",
        "gymnasium",
        "math-verify",
        "vllm",
        "ray",
        "alfworld",
        "bwrap",
        "docker",
    )
    assert len(lines) == len(names)
    for line, name in zip(lines, names, strict=True):
        assert line.split()[0] in ("ok", "missing")
        assert name in line


def test_doctor_json(capsys) -> None:
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["torch"]["ok"] is True


def test_config_error_exit_code(capsys) -> None:
    assert main(["train", "math-tiny", "trainer.nope=1", "--dry-run"]) == 2
    assert "trainer.nope" in capsys.readouterr().err
