"""Setting a task's repository up in a sandbox, and grading an attempt in a fresh one.

Grading never trusts the episode's sandbox. :func:`grade` opens a *new* sandbox, writes a clean
checkout of ``base_commit``, applies the agent's diff with every change to a protected path (tests,
``conftest.py``, pytest configuration: :func:`~envs.repo_coding.testrun.is_protected_path`) dropped,
applies ``test_patch`` (which adds the hidden tests back), runs the task's test files through the
sealed pytest runner (:func:`~envs.repo_coding.testrun.run_pytest`) and reads per-test outcomes
from its report. Only a report sealed with the run's secret, from a pytest session that finished
with the runner's functions untouched, is scored; anything else (an early exit, a killed or
shadowed runner, a report written by the code under test) scores 0, and ``info`` says why
(``report_evidence``, ``checks_completed``, ``runner_tampered``).

Reward and partial score::

    reward        = 1.0 if every FAIL_TO_PASS and every PASS_TO_PASS test passes else 0.0
    partial_score = (passing FAIL_TO_PASS / all FAIL_TO_PASS) * (1.0 if every PASS_TO_PASS passes else 0.5)

A diff that does not apply scores 0. An empty diff scores 0 (every FAIL_TO_PASS fails by construction).
"""

from __future__ import annotations

import functools
import logging
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from envs.repo_coding.task import RepoTask
from envs.repo_coding.testrun import filter_diff, partial_score, run_pytest

log = logging.getLogger(__name__)

GIT = "git -c user.name=agent -c user.email=agent@localhost -c commit.gpgsign=false"
_EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n"


def sandbox_limits() -> Any:
    """Limits for a repository sandbox: more room than a calculator needs (git, pytest, a repo)."""
    from tools_sandbox import SandboxLimits

    return SandboxLimits(memory_mb=1024, cpus=1.0, pids=128, nofile=512, tmpfs_mb=256,
                         output_bytes=256 * 1024, call_timeout=60.0, start_timeout=60.0)


@functools.lru_cache(maxsize=64)
def repo_archive(repo_path: str, commit: str) -> bytes:
    """``git archive`` of ``commit`` (a tar of the tree only: no history, so no gold patch)."""
    r = subprocess.run(["git", "--git-dir", repo_path, "archive", "--format=tar", commit],
                       capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"repo_path: cannot archive {commit} from {repo_path}: {r.stderr.decode()[-400:]}")
    return r.stdout


def _shell(sb: Any, cmd: str, timeout: float) -> Any:
    return sb.run_shell(cmd, timeout=timeout)


def setup_repo(sb: Any, task: RepoTask, timeout: float = 120.0) -> str:
    """Put the task's repository at ``task.workdir`` in ``sb`` as a one-commit git repository;
    returns that commit's id (the agent's diff is taken against it)."""
    wd = shlex.quote(task.workdir)
    if task.repo_path:
        sb.write_file("/tmp/fr_repo.tar", repo_archive(task.repo_path, task.base_commit))
        cmd = (
            f"rm -rf {wd} && mkdir -p {wd} && tar -xf /tmp/fr_repo.tar -C {wd} && rm -f /tmp/fr_repo.tar "
            f"&& cd {wd} && git init -q && printf {shlex.quote(_EXCLUDES)} >> .git/info/exclude "
            f"&& git add -A && {GIT} commit -q -m base && git rev-parse HEAD"
        )
    else:  # a user's SWE-bench image: the repository is already at workdir
        cmd = (
            f"cd {wd} && git reset -q --hard {shlex.quote(task.base_commit)} && git clean -qfdx "
            f"&& git rev-parse HEAD"
        )
    r = _shell(sb, cmd, timeout)
    if r.exit_code != 0 or r.timed_out:
        raise RuntimeError(f"setting up {task.instance_id} failed: {(r.stderr or r.stdout)[-600:]}")
    return r.stdout.strip().splitlines()[-1]


def collect_diff(sb: Any, task: RepoTask, base: str, timeout: float = 60.0) -> tuple[str, str]:
    """The agent's changes (tracked and new files) against ``base`` as a git diff, and an error text
    ('' when fine). Works even when the agent committed its changes."""
    wd = shlex.quote(task.workdir)
    r = _shell(sb, f"cd {wd} && git add -A && git diff --cached --binary --no-color --no-ext-diff "
                   f"{shlex.quote(base)} > /tmp/fr_agent.diff", timeout)
    if r.exit_code != 0 or r.timed_out:
        return "", f"could not compute the diff: {(r.stderr or r.stdout)[-300:]}"
    return sb.read_file("/tmp/fr_agent.diff").decode("utf-8", errors="replace"), ""


@dataclass
class GradeResult:
    """The outcome of grading one attempt (see the module docstring for the rule)."""

    reward: float
    partial_score: float
    fail_to_pass: dict[str, bool] = field(default_factory=dict)
    pass_to_pass_passed: int = 0
    pass_to_pass_total: int = 0
    applied: bool = True
    discarded: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    evidence: str = "missing"
    checks_completed: bool = False
    tampered: list[str] = field(default_factory=list)

    def as_info(self) -> dict[str, Any]:
        return {
            "f2p_passed": sum(self.fail_to_pass.values()),
            "f2p_total": len(self.fail_to_pass),
            "p2p_passed": self.pass_to_pass_passed,
            "p2p_total": self.pass_to_pass_total,
            "patch_applied": self.applied,
            "discarded_files": list(self.discarded),
            "grade_error": self.error,
            "grade_seconds": round(self.seconds, 3),
            "report_evidence": self.evidence,
            "checks_completed": self.checks_completed,
            "runner_tampered": list(self.tampered),
        }


def score(task: RepoTask, report: dict[str, dict[str, str]]) -> GradeResult:
    """Reward and partial score from a pytest report (missing tests count as failing)."""
    ok = {nid: report.get(nid, {}).get("outcome") == "passed" for nid in task.FAIL_TO_PASS}
    p2p_ok = sum(report.get(nid, {}).get("outcome") == "passed" for nid in task.PASS_TO_PASS)
    p2p_all = p2p_ok == len(task.PASS_TO_PASS)
    part = partial_score(sum(ok.values()), len(ok), p2p_all)
    reward = 1.0 if all(ok.values()) and p2p_all else 0.0
    return GradeResult(reward, part, ok, p2p_ok, len(task.PASS_TO_PASS))


def grade_in(sb: Any, task: RepoTask, diff: str, test_timeout: float = 300.0) -> GradeResult:
    """Grade ``diff`` in ``sb``, a sandbox nobody else has touched (see :func:`grade`)."""
    t0 = time.monotonic()
    kept, dropped = filter_diff(diff)
    setup_repo(sb, task)
    wd = shlex.quote(task.workdir)
    zero = GradeResult(0.0, 0.0, dict.fromkeys(task.FAIL_TO_PASS, False), 0, len(task.PASS_TO_PASS),
                       discarded=dropped)
    if kept.strip():
        sb.write_file("/tmp/fr_agent.diff", kept)
        r = _shell(sb, f"cd {wd} && git apply --whitespace=nowarn /tmp/fr_agent.diff", 60)
        if r.exit_code != 0:
            zero.applied, zero.error = False, f"the diff does not apply: {(r.stderr or r.stdout)[-300:]}"
            zero.seconds = time.monotonic() - t0
            return zero
    sb.write_file("/tmp/fr_test.patch", task.test_patch)
    r = _shell(sb, f"cd {wd} && git apply --whitespace=nowarn /tmp/fr_test.patch", 60)
    if r.exit_code != 0:
        raise RuntimeError(f"{task.instance_id}: test_patch does not apply: {(r.stderr or r.stdout)[-300:]}")
    run = run_pytest(sb, task.workdir, task.test_files, test_timeout)
    zero.evidence, zero.checks_completed, zero.tampered = run.evidence, run.finished, run.tampered
    if not run.trusted:
        why = {"missing": "the test run left no sealed report (it ended early or was killed)",
               "forged": "the test report's seal does not match"}.get(run.evidence, "")
        if run.evidence == "sealed":
            why = ("the runner's functions were rebound during the run: " + ", ".join(run.tampered[:5])
                   if run.tampered else "the pytest session did not finish")
        zero.error = f"{why} [{run.status}]; pytest said: {run.output[-300:]}"
        zero.seconds = time.monotonic() - t0
        return zero
    result = score(task, run.report)
    result.discarded = dropped
    result.evidence, result.checks_completed = run.evidence, run.finished
    result.seconds = time.monotonic() - t0
    return result


def grade(task: RepoTask, diff: str, backend: str = "auto", limits: Any = None,
          test_timeout: float = 300.0) -> GradeResult:
    """Grade ``diff`` (a git diff against the task's base) in a fresh sandbox of ``backend``."""
    from tools_sandbox import open_sandbox

    with open_sandbox(backend=backend, limits=limits or sandbox_limits(), image=task.image) as sb:
        return grade_in(sb, task, diff, test_timeout)


def validate(task: RepoTask, backend: str = "auto", test_timeout: float = 300.0) -> dict[str, Any]:
    """Check a task in the sandbox: the gold patch must score 1 and the empty diff must not.
    Returns ``{"instance_id", "ok", "gold", "empty", "error"}``."""
    gold = grade(task, task.patch, backend=backend, test_timeout=test_timeout)
    empty = grade(task, "", backend=backend, test_timeout=test_timeout)
    ok = gold.reward == 1.0 and empty.reward == 0.0 and empty.partial_score < 1.0
    return {"instance_id": task.instance_id, "ok": ok, "gold": gold.as_info(), "empty": empty.as_info(),
            "error": gold.error or empty.error}
