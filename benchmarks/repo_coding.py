"""RepoCoding-v0 latency: episode set-up and grading, per sandbox backend.

Prints, from one run on this machine, medians over ``--reps`` runs per task:
* ``open``: a bare sandbox session (start + close), the floor every episode pays;
* ``setup``: ``env.reset`` (fresh sandbox, copy the repository in, git init) and its ratio to ``open``;
* ``grade``: grading the gold patch in a fresh sandbox (apply diff, add hidden tests, run them) and
  its ratio to running the same test files directly on the host (``host``), i.e. the sandbox overhead.

    python benchmarks/repo_coding.py [--tasks DIR] [--backends docker bwrap] [--reps 3] [--max-tasks 4]

Without ``--tasks`` the seed repositories are built into a temporary folder first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def host_test_seconds(task, workdir: Path) -> float:  # noqa: ANN001
    """Seconds to run the task's test files on the host, on the gold-patched checkout."""
    from envs.repo_coding.builder import default_python, git
    from envs.repo_coding.testrun import PLUGIN_MODULE, REPORT_PLUGIN, pytest_shell

    repo = workdir / "repo"
    repo.mkdir(parents=True)
    tar = subprocess.run(
        ["git", "--git-dir", task.repo_path, "archive", task.base_commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=tar, check=True)
    git(repo, "init", "-q")
    for name, patch in (("t.patch", task.test_patch), ("g.patch", task.patch)):
        (workdir / name).write_text(patch)
        git(repo, "apply", str(workdir / name))
    (workdir / f"{PLUGIN_MODULE}.py").write_text(REPORT_PLUGIN)
    cmd = pytest_shell(task.test_files, str(workdir / "r.json"), str(workdir), default_python())
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], cwd=repo, capture_output=True, timeout=600)
    dt = time.perf_counter() - t0
    report = json.loads((workdir / "r.json").read_text())
    assert all(report.get(n, {}).get("outcome") == "passed" for n in task.FAIL_TO_PASS), "gold fails on host"
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=None, help="task folder (default: build the seed repos)")
    ap.add_argument("--backends", nargs="+", default=["docker", "bwrap"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tasks", type=int, default=4, help="tasks measured, one per repository first")
    a = ap.parse_args()

    from envs.repo_coding.builder import build_tasks
    from envs.repo_coding.env import RepoCodingEnv
    from envs.repo_coding.grading import grade, sandbox_limits
    from envs.repo_coding.task import load_tasks
    from tools_sandbox import backend_status, open_sandbox

    if a.tasks is None:
        a.tasks = tempfile.mkdtemp(prefix="repo-bench-")
        t0 = time.perf_counter()
        build_tasks(a.tasks, seed=0, repos=["seed"], quota=1)
        print(f"built seed tasks in {time.perf_counter() - t0:.1f} s -> {a.tasks}")
    tasks = load_tasks(a.tasks)
    firsts = list({t.repo: t for t in reversed(tasks)}.values())[::-1]  # one per repository first
    chosen = (firsts + [t for t in tasks if t not in firsts])[: a.max_tasks]
    status = backend_status()
    print(
        f"{'backend':<8} {'task':<34} {'open s':>7} {'setup s':>8} {'setup/open':>10} "
        f"{'grade s':>8} {'host s':>7} {'grade/host':>10}"
    )
    for backend in a.backends:
        ok, why = status.get(backend, (False, "unknown backend"))
        if not ok:
            print(f"{backend:<8} skipped: {why}")
            continue
        env = RepoCodingEnv(tasks=chosen, backend=backend)
        for task in chosen:
            opens, setups, grades = [], [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                with open_sandbox(backend=backend, limits=sandbox_limits()):
                    pass
                opens.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                env.reset(options={"task_id": task.instance_id})
                setups.append(time.perf_counter() - t0)
                env._close_sandbox()
                t0 = time.perf_counter()
                r = grade(task, task.patch, backend=backend)
                grades.append(time.perf_counter() - t0)
                assert r.reward == 1.0, r
            with tempfile.TemporaryDirectory() as tmp:
                host = host_test_seconds(task, Path(tmp))
            o, s, g = (statistics.median(x) for x in (opens, setups, grades))
            print(
                f"{backend:<8} {task.instance_id[:34]:<34} {o:7.2f} {s:8.2f} {s / o:10.2f} "
                f"{g:8.2f} {host:7.2f} {g / host:10.2f}"
            )
        env.close()


if __name__ == "__main__":
    main()
