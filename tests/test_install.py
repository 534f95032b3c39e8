"""fr-agents installs without a checkout: a wheel into a fresh virtualenv, then the CLI from
another directory (presets are package data, nothing is read relative to a source tree)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def active_site_packages() -> list[str]:
    """The site-packages folders of the interpreter running the tests: a virtualenv's own when the
    tests run in one (``--system-site-packages`` would expose the *base* interpreter's instead)."""
    import site

    return [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]


def see_active_packages(venv_python: Path) -> None:
    """Let a fresh venv import this environment's packages (torch and friends), as users of
    ``pip install --target`` do: a ``.pth`` file in its site-packages lists the active folders, after
    its own (so the wheel installed into it wins). Only their paths are added: the ``.pth`` files in
    them (such as this checkout's editable install of fr-agents) are not run."""
    out = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(out) / "active_env.pth").write_text("".join(f"{p}\n" for p in active_site_packages()))


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_trains_from_another_directory(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the tracked files")
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        tmp_path,
    )
    (wheel,) = dist.glob("fr_agents-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert (
        presets and {f"fr_agents/configs/{p}" for p in presets} <= names
    )  # configs/ shipped as package data
    assert {f"fr_agents/view/static/{f}" for f in ("app.js", "index.html", "style.css")} <= names
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py, cli = venv / "bin" / "python", venv / "bin" / "fr-agents"
    see_active_packages(py)
    _run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run(
        [str(py), "-c", "import fr_agents, trainer; print(fr_agents.__file__); print(trainer.__file__)"], work
    )
    assert all(line.startswith(str(venv)) for line in where.stdout.split()), where.stdout
    assert "fr_agents/MathVerifier-v0" in _run([str(cli), "envs"], work).stdout
    dry = _run([str(cli), "train", "--dry-run"], work).stdout
    assert "preset: math-tiny" in dry and "nothing was started" in dry
    small = [
        "model.tiny_size=nano",
        "warm_start.examples=0",
        "trainer.eval_episodes=0",
        "trainer.steps=3",
        "trainer.batch_size=8",
        "rollout.concurrency=8",
        "trainer.max_minutes=0",
        "trainer.threads=1",
    ]
    out = _run([str(cli), "train", "math-tiny", *small, "--run-dir", str(work / "run")], work)
    assert "3 steps" in out.stdout, out.stdout[-2000:]
    assert (work / "run" / "checkpoints" / "step_000003").is_dir()
