"""Shared fixtures: a small seed-repo task set (built once per session) and a hand-made task."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from envs.repo_coding.builder import build_tasks, git
from envs.repo_coding.task import RepoTask


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("repo_cache")


@pytest.fixture(scope="session")
def seed_tasks_dir(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Path:
    out = tmp_path_factory.mktemp("seed_tasks")
    build_tasks(out, seed=0, repos=["textkit", "intervals"], cache_dir=build_cache, quota=2)
    return out


def checkout(task: RepoTask, dest: Path) -> Path:
    """A plain copy of the task's base commit in ``dest`` (a one-commit git repo, like the sandbox)."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = subprocess.run(
        ["git", "--git-dir", task.repo_path, "archive", task.base_commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-gpg-sign", "-m", "base")
    return dest


def diff_for(task: RepoTask, edits: dict[str, str | None], patches: tuple[str, ...] = ()) -> str:
    """The git diff an agent would produce by applying ``patches`` then ``edits`` (path -> new text,
    None deletes the file) to the task's base."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = checkout(task, Path(tmp) / "repo")
        for i, p in enumerate(patches):
            (repo / f".p{i}").write_text(p)
            git(repo, "apply", f".p{i}")
            (repo / f".p{i}").unlink()
        for path, text in edits.items():
            if text is None:
                (repo / path).unlink()
            else:
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_text(text)
        git(repo, "add", "-A")
        return git(repo, "diff", "--cached", "HEAD")


BUGGY = (
    "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n\n\ndef neg(a):\n    return -a\n"
)
FIXED = BUGGY.replace("a - b", "a + b", 1).replace("return a + b\n\n\ndef neg", "return a * b\n\n\ndef neg")
VISIBLE_TESTS = "from calc.ops import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"
ALL_TESTS = (
    "from calc.ops import add, mul, neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
)


@pytest.fixture(scope="session")
def two_bug_task(tmp_path_factory: pytest.TempPathFactory) -> RepoTask:
    """A hand-made task with two independent bugs (add, mul): FAIL_TO_PASS has two tests, so fixing
    one of them is measurable partial progress."""
    root = tmp_path_factory.mktemp("two_bug")
    work = root / "work"
    (work / "calc").mkdir(parents=True)
    (work / "tests").mkdir()
    (work / "calc" / "__init__.py").write_text("")
    (work / "calc" / "ops.py").write_text(FIXED)
    (work / "tests" / "test_ops.py").write_text(ALL_TESTS)
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-q", "--no-gpg-sign", "-m", "upstream")
    upstream = git(work, "rev-parse", "HEAD").strip()
    (work / "calc" / "ops.py").write_text(BUGGY)
    (work / "tests" / "test_ops.py").write_text(VISIBLE_TESTS)
    git(work, "commit", "-q", "--no-gpg-sign", "-am", "bug")
    base = git(work, "rev-parse", "HEAD").strip()
    git(work, "tag", "task/two_bug", base)
    bare = root / "calc.git"
    git(root, "clone", "-q", "--mirror", str(work), str(bare))
    shutil.rmtree(work)
    return RepoTask(
        instance_id="calc__two_bugs",
        repo="handmade:calc",
        base_commit=base,
        problem_statement="add and mul are wrong",
        patch=git(bare, "diff", base, upstream, "--", "calc/ops.py"),
        test_patch=git(bare, "diff", base, upstream, "--", "tests/test_ops.py"),
        FAIL_TO_PASS=["tests/test_ops.py::test_add", "tests/test_ops.py::test_mul"],
        PASS_TO_PASS=["tests/test_ops.py::test_neg"],
        repo_path=str(bare),
        test_files=["tests/test_ops.py"],
        visible_test_files=["tests/test_ops.py"],
    )
