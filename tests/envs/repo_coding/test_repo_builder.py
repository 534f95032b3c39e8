"""The offline builder on the project's seed repositories (tests run on the host, no sandbox)."""

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import checkout

from envs.repo_coding.builder import build_tasks, git
from envs.repo_coding.task import load_tasks
from envs.repo_coding.testrun import PLUGIN_MODULE, REPORT_PLUGIN, passed_ids, pytest_shell


def _run(repo: Path, files: list[str]) -> set[str]:
    (repo.parent / f"{PLUGIN_MODULE}.py").write_text(REPORT_PLUGIN)
    report = repo.parent / "report.json"
    subprocess.run(
        ["bash", "-c", pytest_shell(files, str(report), str(repo.parent))],
        cwd=repo,
        capture_output=True,
        timeout=120,
    )
    return passed_ids(json.loads(report.read_text()))


def test_seed_build_shape(seed_tasks_dir):
    tasks = load_tasks(seed_tasks_dir)
    assert len(tasks) == 4
    assert {t.repo for t in tasks} == {"seed:textkit", "seed:intervals"}
    for t in tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert t.patch.startswith("diff --git") and t.test_patch.startswith("diff --git")
        gold_added = [
            ln[1:].strip() for ln in t.patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")
        ]
        assert all(g not in t.problem_statement for g in gold_added if len(g) >= 6)
        for nid in t.FAIL_TO_PASS:
            assert nid in t.problem_statement or "more failing" in t.problem_statement


def test_hidden_tests_are_absent_from_base_and_gold_fixes(seed_tasks_dir, tmp_path):
    t = load_tasks(seed_tasks_dir)[0]
    repo = checkout(t, tmp_path / "repo")
    visible = (repo / t.test_files[0]).read_text()
    for nid in t.FAIL_TO_PASS:
        assert f"def {nid.split('::')[-1].split('[')[0]}(" not in visible
    (tmp_path / "t.patch").write_text(t.test_patch)
    git(repo, "apply", str(tmp_path / "t.patch"))
    passed = _run(repo, t.test_files)
    assert not set(t.FAIL_TO_PASS) & passed and set(t.PASS_TO_PASS) <= passed
    (tmp_path / "g.patch").write_text(t.patch)
    git(repo, "apply", str(tmp_path / "g.patch"))
    passed = _run(repo, t.test_files)
    assert set(t.FAIL_TO_PASS) | set(t.PASS_TO_PASS) <= passed


def test_deterministic_and_reused(seed_tasks_dir, build_cache, tmp_path):
    again = tmp_path / "again"
    build_tasks(again, seed=0, repos=["textkit", "intervals"], cache_dir=build_cache, quota=2)
    assert (again / "tasks.jsonl").read_text() == (seed_tasks_dir / "tasks.jsonl").read_text()
    stamp = (again / "tasks.jsonl").stat().st_mtime_ns
    build_tasks(again, seed=0, repos=["textkit", "intervals"], cache_dir=build_cache, quota=2)
    assert (again / "tasks.jsonl").stat().st_mtime_ns == stamp  # reused, not rebuilt
    (other,) = build_tasks(tmp_path / "other", seed=1, repos=["textkit"], cache_dir=build_cache, quota=1)
    first = next(t for t in load_tasks(seed_tasks_dir) if t.repo == "seed:textkit")
    assert other.instance_id != first.instance_id  # another seed draws another bug


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown repository"):
        build_tasks(tmp_path, repos=["nope"], cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="quota"):
        build_tasks(tmp_path, repos=["textkit"], cache_dir=tmp_path / "c", quota=0)


def test_cli_build_and_stats(build_cache, tmp_path, capsys):
    from fr_agents.cli import main

    out = tmp_path / "cli"
    rc = main(
        [
            "repo-tasks",
            "build",
            "--out",
            str(out),
            "--repos",
            "textkit",
            "--quota",
            "1",
            "--cache-dir",
            str(build_cache),
        ]
    )
    assert rc == 0 and json.loads(capsys.readouterr().out)["tasks"] == 1
    assert main(["repo-tasks", "stats", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["per_repo"] == {"seed:textkit": 1}


@pytest.mark.slow
def test_real_repos_build_50_tasks_in_10_minutes(tmp_path):
    """The CI acceptance build: >= 50 tasks from >= 3 real repositories (default cache: sdists are
    downloaded with pip the first time, then reused)."""
    t0 = time.monotonic()
    tasks = build_tasks(tmp_path / "real", seed=0, repos=["real"], workers=2)
    assert time.monotonic() - t0 < 600
    per_repo = {}
    for t in tasks:
        per_repo[t.repo] = per_repo.get(t.repo, 0) + 1
    assert len(tasks) >= 50 and len(per_repo) >= 3, per_repo
