"""Setting a task's repository up in a sandbox, and grading an attempt in fresh ones.

Grading never trusts the episode's sandbox, nor anything the code under test can write or wrap.
:func:`grade` uses two *new* sandboxes:

1. **Reference** (:func:`reference_run`): a clean checkout of ``base_commit`` plus ``test_patch``;
   the trusted test files are read and rewritten on the host (:func:`envs.repo_coding.checks.rewrite`:
   every check records the plain data of its computed operands; literals stay on the host; perturbed
   variants of checks with literal call arguments are added, drawn per grading), then the gold
   ``patch`` is applied and the rewritten tests run through the sealed runner
   (:func:`~envs.repo_coding.testrun.run_pytest`). The gold patch must pass every FAIL_TO_PASS and
   PASS_TO_PASS test, else grading cannot happen.
2. **Candidate**: a clean checkout of ``base_commit``, the agent's diff with every change to a
   protected path (tests, ``conftest.py``, pytest configuration:
   :func:`~envs.repo_coding.protected.is_protected_path`) dropped, ``test_patch``, the same rewritten
   test files on top, the same runner. Patch files are deleted once applied; the gold patch, the
   original hidden tests and the reference's records never enter this sandbox.

A test passes when the candidate's sealed report says pytest passed it, its records satisfy every
check (evaluated on the host) and equal the reference's records, variants included
(:func:`~envs.repo_coding.judge.verdicts`). A report that is not sealed, from a session that did
not finish, with runner functions rebound or plugins registered during the run, scores 0, and
``info`` says why (``report_evidence``, ``checks_completed``, ``runner_tampered``, ``test_failures``).

Reward and partial score::

    reward        = 1.0 if every FAIL_TO_PASS and every PASS_TO_PASS test passes else 0.0
    partial_score = (passing FAIL_TO_PASS / all FAIL_TO_PASS) * (1.0 if every PASS_TO_PASS passes else 0.5)

A diff that does not apply scores 0. An empty diff scores 0 (every FAIL_TO_PASS fails by construction).
When grading cannot happen (a sandbox that will not start, a set-up or file transfer that fails, a
task whose patches do not apply or whose gold patch fails, a runner that crashes before any
repository code is loaded), :func:`grade` raises :class:`~fr_agents.errors.InfrastructureFailure`.
Whatever happens once the candidate's code runs (it exits, hangs, exhausts memory, kills every
process of its sandbox) is the candidate's failure: 0, never an aborted episode.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envs.repo_coding import checks, judge
from envs.repo_coding.protected import filter_diff
from envs.repo_coding.task import RepoTask
from envs.repo_coding.testrun import PytestRun, partial_score, run_pytest
from fr_agents.errors import InfrastructureFailure

log = logging.getLogger(__name__)

GIT = "git -c user.name=agent -c user.email=agent@localhost -c commit.gpgsign=false"
_EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n"


def sandbox_limits() -> Any:
    """Limits for a repository sandbox: more room than a calculator needs (git, pytest, a repo)."""
    from tools_sandbox import SandboxLimits

    return SandboxLimits(
        memory_mb=1024,
        cpus=1.0,
        pids=128,
        nofile=512,
        tmpfs_mb=256,
        output_bytes=256 * 1024,
        call_timeout=60.0,
        start_timeout=60.0,
    )


@functools.lru_cache(maxsize=64)
def repo_archive(repo_path: str, commit: str) -> bytes:
    """``git archive`` of ``commit`` (a tar of the tree only: no history, so no gold patch)."""
    r = subprocess.run(
        ["git", "--git-dir", repo_path, "archive", "--format=tar", commit], capture_output=True, timeout=120
    )
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
    r = _shell(
        sb,
        f"cd {wd} && git add -A && git diff --cached --binary --no-color --no-ext-diff "
        f"{shlex.quote(base)} > /tmp/fr_agent.diff",
        timeout,
    )
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
    failures: dict[str, str] = field(default_factory=dict)

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
            "test_failures": dict(list(self.failures.items())[:10]),
        }


def score(task: RepoTask, report: dict[str, dict[str, str]]) -> GradeResult:
    """Reward and partial score from a pytest report (missing tests count as failing)."""
    ok = {nid: report.get(nid, {}).get("outcome") == "passed" for nid in task.FAIL_TO_PASS}
    p2p_ok = sum(report.get(nid, {}).get("outcome") == "passed" for nid in task.PASS_TO_PASS)
    p2p_all = p2p_ok == len(task.PASS_TO_PASS)
    part = partial_score(sum(ok.values()), len(ok), p2p_all)
    reward = 1.0 if all(ok.values()) and p2p_all else 0.0
    return GradeResult(reward, part, ok, p2p_ok, len(task.PASS_TO_PASS))


class _Infra(InfrastructureFailure):
    """Grading could not happen (an :class:`~fr_agents.errors.InfrastructureFailure`)."""


def _apply(sb: Any, task: RepoTask, text: str, name: str) -> Any:
    """``git apply`` ``text`` in the task's repository; the patch file is removed afterwards either way
    (the code under test must not find the hidden tests or the gold patch in /tmp)."""
    wd = shlex.quote(task.workdir)
    path = f"/tmp/{name}"
    sb.write_file(path, text)
    return _shell(sb, f"cd {wd} && git apply --whitespace=nowarn {path}; rc=$?; rm -f {path}; exit $rc", 60)


def _write_tests(sb: Any, task: RepoTask, files: dict[str, str]) -> None:
    for path, text in files.items():
        sb.write_file(f"{task.workdir.rstrip('/')}/{path}", text)


@dataclass
class Reference:
    """The rewritten checks and what the gold patch recorded (:func:`reference_run`)."""

    plan: checks.Plan
    run: PytestRun
    unstable_sites: set[int] = field(default_factory=set)
    unstable_tests: set[str] = field(default_factory=set)


def reference_run(sb: Any, task: RepoTask, rng: random.Random, test_timeout: float) -> Reference:
    """In ``sb`` (fresh): read the trusted test files (base + ``test_patch``), rewrite them
    (:func:`checks.rewrite`), and run them on the gold patch, twice (what differs between the two
    runs is not compared with the candidate's values). Raises ``_Infra`` when this cannot be done or
    the gold patch does not pass every FAIL_TO_PASS and PASS_TO_PASS test."""
    try:
        setup_repo(sb, task)
    except RuntimeError as e:
        raise _Infra("sandbox_setup", str(e)) from e
    r = _apply(sb, task, task.test_patch, "fr_test.patch")
    if r.exit_code != 0:
        raise _Infra(
            "task_invalid", f"{task.instance_id}: test_patch does not apply: {(r.stderr or r.stdout)[-300:]}"
        )
    trusted = {}
    for f in task.test_files:
        try:
            trusted[f] = sb.read_file(f"{task.workdir.rstrip('/')}/{f}").decode("utf-8")
        except Exception as e:  # noqa: BLE001 - SandboxError, UnicodeDecodeError
            raise _Infra("task_invalid", f"{task.instance_id}: cannot read the test file {f}: {e}") from e
    plan = checks.rewrite(trusted, rng)
    r = _apply(sb, task, task.patch, "fr_gold.patch")
    if r.exit_code != 0:
        raise _Infra(
            "task_invalid",
            f"{task.instance_id}: the gold patch does not apply: {(r.stderr or r.stdout)[-300:]}",
        )
    _write_tests(sb, task, plan.files)
    run = run_pytest(sb, task.workdir, task.test_files, test_timeout)
    if not run.trusted:
        raise _Infra(
            "reference_run",
            f"{task.instance_id}: the reference run left no trusted report "
            f"({run.evidence}, {run.status}): {run.output[-400:]}",
        )
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    failed = {
        n: v.why for n, v in judge.verdicts(plan, run.report, run.records, None, ids).items() if not v.passed
    }
    if failed:
        raise _Infra(
            "reference_failed",
            f"{task.instance_id}: the gold patch fails the rewritten checks: "
            f"{dict(list(failed.items())[:3])}",
        )
    again = run_pytest(sb, task.workdir, task.test_files, test_timeout)
    if not again.trusted:
        raise _Infra(
            "reference_run",
            f"{task.instance_id}: the second reference run left no trusted report "
            f"({again.evidence}, {again.status}): {again.output[-400:]}",
        )
    sites, tests = judge.unstable(run.records, again.records)
    return Reference(plan, run, sites, tests)


def grade_in(
    sb: Any, task: RepoTask, diff: str, test_timeout: float = 300.0, reference: Reference | None = None
) -> GradeResult:
    """Grade ``diff`` in ``sb``, a sandbox nobody else has touched, against ``reference`` (the
    rewritten checks and the gold run's records, from :func:`reference_run` in *another* fresh
    sandbox; made here, in a second sandbox of ``sb``'s backend, when not given)."""
    t0 = time.monotonic()
    if reference is None:
        with _open(sb.backend, sb.limits, task.image) as ref_sb:
            reference = reference_run(ref_sb, task, random.Random(secrets.randbits(64)), test_timeout)
    plan, ref = reference.plan, reference.run
    kept, dropped = filter_diff(diff)
    try:
        setup_repo(sb, task)
    except RuntimeError as e:
        raise _Infra("sandbox_setup", str(e)) from e
    zero = GradeResult(
        0.0, 0.0, dict.fromkeys(task.FAIL_TO_PASS, False), 0, len(task.PASS_TO_PASS), discarded=dropped
    )
    if kept.strip():
        r = _apply(sb, task, kept, "fr_agent.diff")
        if r.exit_code != 0:
            zero.applied, zero.error = False, f"the diff does not apply: {(r.stderr or r.stdout)[-300:]}"
            zero.seconds = time.monotonic() - t0
            return zero
    r = _apply(sb, task, task.test_patch, "fr_test.patch")
    if r.exit_code != 0:  # the agent's (filtered) changes collide with the test patch's other files
        zero.error = f"test_patch does not apply on top of the diff: {(r.stderr or r.stdout)[-300:]}"
        zero.seconds = time.monotonic() - t0
        return zero
    _write_tests(sb, task, plan.files)  # the rewritten checks, over the hidden tests test_patch added
    run = run_pytest(sb, task.workdir, task.test_files, test_timeout)
    if not run.ready and run.status not in ("timeout", "oom", "pids", "crashed"):
        raise _Infra(
            "runner_crashed",
            f"the test runner failed before loading the repository [{run.status}]: {run.output[-400:]}",
        )
    zero.evidence, zero.checks_completed, zero.tampered = (
        run.evidence,
        run.finished,
        run.tampered + run.late_plugins,
    )
    if not run.trusted:
        why = {
            "missing": "the test run left no sealed report (it ended early or was killed)",
            "forged": "the test report's seal does not match",
        }.get(run.evidence, "")
        if run.evidence == "sealed":
            why = (
                "the runner's functions were rebound during the run: " + ", ".join(run.tampered[:5])
                if run.tampered
                else "plugins were registered during the run: " + ", ".join(run.late_plugins[:5])
                if run.late_plugins
                else "the pytest session did not finish"
            )
        zero.error = f"{why} [{run.status}]; pytest said: {run.output[-300:]}"
        zero.seconds = time.monotonic() - t0
        return zero
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    per_test = judge.verdicts(
        plan,
        run.report,
        run.records,
        ref.records,
        ids,
        reference.unstable_sites,
        reference.unstable_tests,
        set(task.PASS_TO_PASS),
    )
    result = score(task, {n: {"outcome": "passed" if v.passed else "failed"} for n, v in per_test.items()})
    result.discarded = dropped
    result.evidence, result.checks_completed = run.evidence, run.finished
    result.failures = {n: v.why for n, v in per_test.items() if not v.passed}
    result.seconds = time.monotonic() - t0
    return result


@contextlib.contextmanager
def _open(backend: str, limits: Any, image: str | None) -> Iterator[Any]:
    """A fresh sandbox; one that cannot start is an infrastructure failure, not a wrong answer."""
    from tools_sandbox import SandboxError, open_sandbox

    try:
        sb = open_sandbox(backend=backend, limits=limits, image=image)
    except (SandboxError, RuntimeError, OSError) as e:
        raise _Infra("sandbox_start", f"{type(e).__name__}: {e}") from e
    with sb:
        yield sb


def grade(
    task: RepoTask, diff: str, backend: str = "auto", limits: Any = None, test_timeout: float = 300.0
) -> GradeResult:
    """Grade ``diff`` (a git diff against the task's base): the reference run in one fresh sandbox,
    the candidate's in another (see the module docstring). Raises
    :class:`~fr_agents.errors.InfrastructureFailure` when grading could not happen (a sandbox that
    will not start or dies outside the candidate's test run, a task whose patches do not apply, a
    reference run that fails, a runner that crashes before the repository is loaded)."""
    from tools_sandbox import SandboxError

    limits = limits or sandbox_limits()
    try:
        with _open(backend, limits, task.image) as ref_sb:
            reference = reference_run(ref_sb, task, random.Random(secrets.randbits(64)), test_timeout)
        with _open(backend, limits, task.image) as sb:
            return grade_in(sb, task, diff, test_timeout, reference)
    except SandboxError as e:  # a file transfer or set-up call failed: the sandbox, not the candidate
        raise InfrastructureFailure("sandbox_died", f"{type(e).__name__}: {e}") from e


def validate(task: RepoTask, backend: str = "auto", test_timeout: float = 300.0) -> dict[str, Any]:
    """Check a task in the sandbox: the gold patch must score 1 and the empty diff must not.
    Returns ``{"instance_id", "ok", "gold", "empty", "error"}``."""
    try:
        gold = grade(task, task.patch, backend=backend, test_timeout=test_timeout)
        empty = grade(task, "", backend=backend, test_timeout=test_timeout)
    except InfrastructureFailure as e:
        return {"instance_id": task.instance_id, "ok": False, "gold": {}, "empty": {}, "error": str(e)}
    ok = gold.reward == 1.0 and empty.reward == 0.0 and empty.partial_score < 1.0
    return {
        "instance_id": task.instance_id,
        "ok": ok,
        "gold": gold.as_info(),
        "empty": empty.as_info(),
        "error": gold.error or empty.error,
    }
