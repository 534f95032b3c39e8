"""The offline task builder: inject bugs into real repositories, keep the ones tests catch.

For each repository (:mod:`envs.repo_coding.specs`):

1. Materialise the pristine tree (a seed repository, or a pinned sdist from ``pip download``, kept
   in the cache so later builds need no network) and commit it to a scratch git repository.
2. Run its tests once (the *baseline*); only tests that pass there can be FAIL_TO_PASS / PASS_TO_PASS.
3. List every AST mutation of the target files (:mod:`.mutations`), shuffle with the seed, move the
   ones on lines the tests execute (one traced test run) and in functions the tests name to the
   front (they are caught far more often), and test
   each candidate (in parallel, one scratch copy per worker). A mutation is kept when at least one
   baseline-passing test fails (FAIL_TO_PASS, at most ``max_fail_to_pass``) and, by construction,
   the others still pass (PASS_TO_PASS).
4. Hide the tests: every test *function* holding a FAIL_TO_PASS id is cut out of the visible test
   file; ``test_patch`` adds them back at grading time. ``base_commit`` = mutated source + visible
   tests; ``patch`` (gold) = the reverse of the mutation.
5. Write ``DIR/tasks.jsonl`` and ``DIR/repos/NAME.git`` (bare). Commits use fixed authors and dates,
   so the same seed gives byte-identical tasks and commit ids. A finished ``DIR`` whose manifest
   key matches is reused as is; test runs are cached by content under the cache folder.

The problem statement is written from the failing tests' names and their assertion messages only;
any message that quotes the original (gold) line is redacted.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envs.repo_coding.mutations import Mutation, find_mutations
from envs.repo_coding.specs import RepoSpec, specs_by_name
from envs.repo_coding.task import RepoTask, save_tasks
from envs.repo_coding.testrun import PLUGIN_MODULE, REPORT_PLUGIN, passed_ids, pytest_shell

log = logging.getLogger(__name__)

BUILDER_VERSION = "3"
SEED_DIR = Path(__file__).parent / "seed_repos"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "fr-agents",
    "GIT_AUTHOR_EMAIL": "fr-agents@localhost",
    "GIT_COMMITTER_NAME": "fr-agents",
    "GIT_COMMITTER_EMAIL": "fr-agents@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def default_cache_dir() -> Path:
    """``$FR_AGENTS_CACHE/repo_coding`` or ``~/.cache/fr_agents/repo_coding``."""
    root = os.environ.get("FR_AGENTS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fr_agents")
    return Path(root) / "repo_coding"


def default_python() -> str:
    """The interpreter tests run under while building: ``/usr/bin/python3`` when it has pytest (on a
    Debian bookworm host it matches the sandbox image's python and pytest, which grading runs), else
    this one."""
    cand = "/usr/bin/python3"
    if os.path.exists(cand):
        ok = subprocess.run([cand, "-c", "import pytest"], capture_output=True, timeout=60).returncode == 0
        if ok:
            return cand
    return sys.executable


def git(cwd: str | Path, *argv: str, check: bool = True) -> str:
    """Run git with the builder's fixed identity and dates; returns stdout."""
    env = {**os.environ, **_GIT_ENV}
    r = subprocess.run(["git", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(argv)} failed in {cwd}: {r.stderr.strip()}")
    return r.stdout


# ----------------------------------------------------------------------------- sources


def fetch_sdist(pin: str, cache_dir: Path) -> Path:
    """The cached sdist of ``pin`` (``NAME==VERSION``), downloading it with pip the first time."""
    if "==" not in pin:
        raise ValueError(f"source: a pypi source must be pinned as NAME==VERSION, got {pin!r}")
    folder = cache_dir / "sdists" / pin.replace("==", "-")
    found = sorted(folder.glob("*.tar.gz")) + sorted(folder.glob("*.zip"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    log.info("downloading the sdist of %s", pin)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-binary",
        ":all:",
        "--no-deps",
        "-q",
        pin,
        "-d",
        str(folder),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = sorted(folder.glob("*.tar.gz")) + sorted(folder.glob("*.zip"))
    if r.returncode != 0 or not found:
        raise RuntimeError(f"pip download of {pin} failed: {r.stderr.strip()[-800:]}")
    return found[0]


def materialize(spec: RepoSpec, cache_dir: Path, dest: Path) -> None:
    """Write the pristine tree of ``spec`` into the empty folder ``dest``."""
    kind, _, what = spec.source.partition(":")
    if kind == "seed":
        src = SEED_DIR / what
        if not src.is_dir():
            raise FileNotFoundError(f"source: no seed repository {what!r} under {SEED_DIR}")
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(src).as_posix()
                rel = rel[: -len(".txt")] if rel.endswith(".py.txt") else rel
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest / rel)
    elif kind == "pypi":
        archive = fetch_sdist(what, cache_dir)
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
            tops = os.listdir(tmp)
            root = Path(tmp) / tops[0] if len(tops) == 1 else Path(tmp)
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if path.is_file() and not any(
                    p.endswith(".egg-info") or p == "__pycache__" for p in rel.parts
                ):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, dest / rel)
    else:
        raise ValueError(f"source: expected 'seed:NAME' or 'pypi:NAME==VERSION', got {spec.source!r}")
    for target in spec.targets:
        if not (dest / target).is_file():
            raise FileNotFoundError(f"targets: {spec.name} has no file {target}")


# ----------------------------------------------------------------------------- test runs


class TestRunner:
    """Runs pytest on the host in scratch folders (the builder's code is ours or pinned sdists),
    caching each run's report by content."""

    def __init__(self, cache_dir: Path, python: str) -> None:
        self.cache_dir = cache_dir
        self.python = python
        self.plugin_dir = cache_dir / "plugin"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        plugin = self.plugin_dir / f"{PLUGIN_MODULE}.py"
        if not plugin.exists() or plugin.read_text() != REPORT_PLUGIN:
            plugin.write_text(REPORT_PLUGIN)
        self.runs_dir = cache_dir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.ident = subprocess.run(
            [python, "-c", "import sys, pytest; print(sys.version, pytest.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()

    def run(
        self, repo: Path, files: list[str], key: str, timeout: float, trace: list[str] | None = None
    ) -> dict | None:
        """The report of ``pytest files`` in ``repo`` (None when pytest hung or wrote nothing)."""
        digest = hashlib.sha256(f"{self.ident}|{key}|{files}|{trace}".encode()).hexdigest()
        cached = self.runs_dir / f"{digest}.json"
        if cached.exists():
            data = json.loads(cached.read_text())
            return data.get("report")
        fd, report_path = tempfile.mkstemp(suffix=".json", prefix="fr_report_")
        os.close(fd)
        os.unlink(report_path)
        cmd = pytest_shell(files, report_path, str(self.plugin_dir), self.python, trace)
        report = None
        try:
            subprocess.run(["bash", "-c", cmd], cwd=repo, capture_output=True, timeout=timeout)
            if os.path.exists(report_path):
                report = json.loads(Path(report_path).read_text())
        except subprocess.TimeoutExpired:
            report = None
        finally:
            if os.path.exists(report_path):
                os.unlink(report_path)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps({"report": report}))
        tmp.replace(cached)
        return report


# ----------------------------------------------------------------------------- hiding tests


def hide_tests(source: str, qualnames: set[tuple[str, ...]]) -> str | None:
    """``source`` with the test functions named by ``qualnames`` (e.g. ``("TestX", "test_y")``) cut
    out, or None when one of them cannot be found as a plain definition."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    cut: list[tuple[int, int, str | None]] = []  # (first line, last line, replacement)
    found: set[tuple[str, ...]] = set()

    def visit(body: list[ast.stmt], prefix: tuple[str, ...]) -> bool:
        """Cut matching defs from ``body``; True when every statement of ``body`` was cut."""
        removed = 0
        for node in body:
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and prefix + (node.name,) in qualnames
            ):
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                cut.append((first, node.end_lineno or node.lineno, None))
                found.add(prefix + (node.name,))
                removed += 1
            elif (
                isinstance(node, ast.ClassDef)
                and any(q[: len(prefix) + 1] == prefix + (node.name,) for q in qualnames)
                and visit(node.body, prefix + (node.name,))
            ):
                indent = " " * node.body[0].col_offset
                first_cut = min(i for i, c in enumerate(cut) if c[0] >= node.body[0].lineno)
                a, b, _ = cut[first_cut]
                cut[first_cut] = (a, b, f"{indent}pass\n")
        return removed == len(body)

    visit(tree.body, ())
    if found != qualnames:
        return None
    out = list(lines)
    for a, b, repl in sorted(cut, reverse=True):
        out[a - 1 : b] = [repl] if repl else []
    text = "".join(out)
    try:
        ast.parse(text)
    except SyntaxError:
        return None
    return text


def qualname_of(nodeid: str) -> tuple[str, tuple[str, ...]]:
    """``("tests/test_x.py", ("TestX", "test_y"))`` for ``tests/test_x.py::TestX::test_y[p]``."""
    head = nodeid.split("[", 1)[0]  # parameter ids may contain "::"
    parts = head.split("::")
    return parts[0], tuple(parts[1:])


# ----------------------------------------------------------------------------- problem statements


def problem_statement(spec: RepoSpec, f2p: list[str], report: dict, gold_lines: list[str]) -> str:
    """The issue text: the failing tests' names and assertion messages, never the fix."""
    shown = f2p[:6]
    items = []
    for nid in shown:
        msg = " ".join(str(report.get(nid, {}).get("message", "")).split())
        if any(len(g.strip()) >= 6 and g.strip() in msg for g in gold_lines):
            msg = "(message withheld)"
        if len(msg) > 240:
            msg = msg[:240] + " ..."
        items.append(f"- `{nid}`" + (f"\n  fails with: {msg}" if msg else ""))
    more = f"\n- ... and {len(f2p) - len(shown)} more failing test(s)" if len(f2p) > len(shown) else ""
    return (
        f"A regression was introduced in `{spec.name}`. Our CI reports these tests failing "
        "(they are not in your checkout; the grader runs them):\n\n"
        + "\n".join(items)
        + more
        + "\n\nFind the bug in the library code and fix it so that these tests pass again without "
        "breaking the existing ones. Do not edit tests: changes to test files are discarded."
    )


# ----------------------------------------------------------------------------- one repository


@dataclass
class _Accepted:
    src: str
    mutation: Mutation
    f2p: list[str]
    p2p: list[str]
    report: dict


def _evaluate(
    spec: RepoSpec,
    runner: TestRunner,
    repo: Path,
    base_key: str,
    src: str,
    original: str,
    m: Mutation,
    passing: set[str],
) -> _Accepted | None:
    mutated = m.apply(original)
    (repo / src).write_text(mutated)
    try:
        key = f"{base_key}|{src}|{hashlib.sha256(mutated.encode()).hexdigest()}"
        files = list(spec.targets[src])
        report = runner.run(repo, files, key, spec.test_timeout_s)
    finally:
        (repo / src).write_text(original)
    if report is None:
        return None
    relevant = {nid for nid in passing if nid.split("::")[0] in files}
    still = passed_ids(report)
    f2p = sorted(relevant - still)
    if not f2p or len(f2p) > spec.max_fail_to_pass or any(k.startswith("<collect>") for k in report):
        return None
    p2p = sorted(relevant & still)
    return _Accepted(src, m, f2p, p2p, report)


def build_repo(
    spec: RepoSpec, seed: int, cache_dir: Path, runner: TestRunner, workers: int, out_repos: Path
) -> list[RepoTask]:
    """Tasks for one repository (see the module docstring)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"fr_build_{spec.name}_") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        materialize(spec, cache_dir, work)
        git(work, "init", "-q", "-b", "upstream")
        git(work, "add", "-A")
        git(work, "commit", "-q", "--no-gpg-sign", "-m", f"{spec.source} (pristine)")
        upstream = git(work, "rev-parse", "HEAD").strip()
        baseline = runner.run(work, spec.test_files, f"{upstream}|baseline", spec.test_timeout_s * 2)
        if baseline is None:
            raise RuntimeError(f"{spec.name}: the baseline test run hung or crashed")
        passing = {n for n in passed_ids(baseline) if not any(n.startswith(d) for d in spec.deselect)}
        log.info("%s: %d baseline tests pass", spec.name, len(passing))

        candidates: list[tuple[str, Mutation]] = []
        originals = {src: (work / src).read_text() for src in sorted(spec.targets)}
        for src, text in originals.items():
            candidates += [(src, m) for m in find_mutations(text)]
        random.Random(f"{seed}:{spec.name}").shuffle(candidates)
        # Bugs on lines the tests execute, in functions the tests name, are far more often caught:
        # try those first (a stable sort keeps the seeded order inside each group).
        traced = runner.run(
            work, spec.test_files, f"{upstream}|trace", spec.test_timeout_s * 4, sorted(spec.targets)
        )
        executed = {k: set(v) for k, v in ((traced or {}).get("<lines>") or {}).get("files", {}).items()}
        test_text = "\n".join((work / t).read_text(errors="replace") for t in spec.test_files)
        named = {
            fn for fn in {m.function for _, m in candidates} if re.search(rf"\b{re.escape(fn)}\b", test_text)
        }

        def ran(src: str, m: Mutation) -> bool:
            return any(ln in executed.get(src, ()) for ln in range(m.line - 2, m.line + 1))

        candidates.sort(key=lambda c: (not ran(*c), c[1].function not in named))
        candidates = candidates[: spec.quota * 8]

        copies = []
        for i in range(workers):
            c = Path(tmp) / f"w{i}"
            shutil.copytree(work, c, ignore=shutil.ignore_patterns(".git"))
            copies.append(c)
        free = list(copies)
        lock = threading.Lock()

        def job(item: tuple[str, Mutation]) -> _Accepted | None:
            with lock:
                repo = free.pop()
            try:
                src, m = item
                return _evaluate(spec, runner, repo, upstream, src, originals[src], m, passing)
            finally:
                with lock:
                    free.append(repo)

        tasks: list[RepoTask] = []
        tried = 0
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for start in range(0, len(candidates), workers):
                chunk = candidates[start : start + workers]
                tried += len(chunk)
                for res in pool.map(job, chunk):
                    if res is not None and len(tasks) < spec.quota:
                        task = _make_task(spec, work, upstream, res, originals[res.src])
                        if task is not None:
                            tasks.append(task)
                if len(tasks) >= spec.quota:
                    break
        dest = out_repos / f"{spec.name}.git"
        if dest.exists():
            shutil.rmtree(dest)
        git(tmp, "clone", "-q", "--mirror", "--no-local", str(work), str(dest))
    log.info("%s: %d tasks from %d candidates in %.1fs", spec.name, len(tasks), tried, time.monotonic() - t0)
    return tasks


def _make_task(spec: RepoSpec, work: Path, upstream: str, acc: _Accepted, original: str) -> RepoTask | None:
    by_file: dict[str, set[tuple[str, ...]]] = {}
    for nid in acc.f2p:
        path, qual = qualname_of(nid)
        by_file.setdefault(path, set()).add(qual)
    visible: dict[str, str] = {}
    for path, quals in sorted(by_file.items()):
        hidden = hide_tests((work / path).read_text(), quals)
        if hidden is None:
            log.debug("%s: cannot hide %s in %s", spec.name, quals, path)
            return None
        visible[path] = hidden
    digest = hashlib.sha256(f"{acc.src}|{acc.mutation.key}".encode()).hexdigest()[:8]
    instance_id = f"{spec.name}__{acc.mutation.kind}-{digest}"
    git(work, "checkout", "-q", "--detach", upstream)
    (work / acc.src).write_text(acc.mutation.apply(original))
    for path, text in visible.items():
        (work / path).write_text(text)
    git(work, "commit", "-q", "--no-gpg-sign", "-am", f"{instance_id}")
    base = git(work, "rev-parse", "HEAD").strip()
    git(work, "tag", "-f", f"task/{instance_id}", base)
    git(work, "checkout", "-q", "--detach", upstream)
    patch = git(work, "diff", base, upstream, "--", acc.src)
    test_patch = git(work, "diff", base, upstream, "--", *sorted(visible))
    gold_lines = [ln[1:] for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return RepoTask(
        instance_id=instance_id,
        repo=spec.source,
        base_commit=base,
        problem_statement=problem_statement(spec, acc.f2p, acc.report, gold_lines),
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=acc.f2p,
        PASS_TO_PASS=acc.p2p,
        repo_path=f"repos/{spec.name}.git",
        test_files=list(spec.targets[acc.src]),
        visible_test_files=spec.test_files,
        version=spec.source.partition("==")[2] or "seed",
        environment_setup_commit=upstream,
        mutation={
            "kind": acc.mutation.kind,
            "file": acc.src,
            "line": acc.mutation.line,
            "function": acc.mutation.function,
            "note": acc.mutation.note,
        },
    )


# ----------------------------------------------------------------------------- entry point


def build_key(specs: list[RepoSpec], seed: int, python_ident: str) -> str:
    blob = json.dumps(
        {"v": BUILDER_VERSION, "seed": seed, "specs": [s.describe() for s in specs], "py": python_ident},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def build_tasks(
    out: str | Path,
    seed: int = 0,
    repos: list[str] | None = None,
    cache_dir: str | Path | None = None,
    workers: int = 2,
    python: str | None = None,
    quota: int | None = None,
    force: bool = False,
) -> list[RepoTask]:
    """Build (or reuse) the task set in ``out``; returns the tasks (``repo_path`` resolved).

    ``repos``: spec names, or ``seed`` / ``real`` / ``all`` (default all). ``quota`` overrides every
    spec's task count. The result is reused when ``out/manifest.json`` has the same key.
    """
    from envs.repo_coding.task import load_tasks

    out = Path(out)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    specs = specs_by_name(repos)
    if quota is not None:
        if quota < 1:
            raise ValueError(f"quota must be >= 1, got {quota}")
        specs = [RepoSpec(**{**s.__dict__, "quota": quota}) for s in specs]
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    runner = TestRunner(cache, python or default_python())
    key = build_key(specs, seed, runner.ident)
    manifest = out / "manifest.json"
    reusable = not force and manifest.exists() and (out / "tasks.jsonl").exists()
    if reusable and json.loads(manifest.read_text()).get("key") == key:
        log.info("reusing the task set in %s", out)
        return load_tasks(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "repos").mkdir(exist_ok=True)
    tasks: list[RepoTask] = []
    for spec in specs:
        tasks += build_repo(spec, seed, cache, runner, workers, out / "repos")
    save_tasks(tasks, out / "tasks.jsonl")
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.repo] = counts.get(t.repo, 0) + 1
    manifest.write_text(
        json.dumps({"key": key, "seed": seed, "tasks": len(tasks), "per_repo": counts}, indent=1)
    )
    return load_tasks(out)
