import json

import pytest

from envs.repo_coding.task import RepoTask, TaskFormatError, load_tasks, save_tasks

ROW = {
    "instance_id": "octo__lib-1",
    "repo": "octo/lib",
    "base_commit": "abc123",
    "problem_statement": "it breaks",
    "patch": "diff --git a/lib.py b/lib.py\n",
    "test_patch": "diff --git a/tests/test_lib.py b/tests/test_lib.py\n",
    # SWE-bench on the Hub stores these lists as JSON strings
    "FAIL_TO_PASS": json.dumps(["tests/test_lib.py::test_new"]),
    "PASS_TO_PASS": json.dumps(["tests/test_lib.py::test_old", "tests/other.py::test_x"]),
    "version": "1.0",
    "environment_setup_commit": "abc123",
    "created_at": "2024-01-01",
}


def test_swebench_jsonl_row_loads_with_image_and_testbed(tmp_path):
    p = tmp_path / "swe.jsonl"
    p.write_text(json.dumps(ROW) + "\n\n")
    (t,) = load_tasks(p)
    assert t.FAIL_TO_PASS == ["tests/test_lib.py::test_new"]
    assert t.test_files == ["tests/other.py", "tests/test_lib.py"]
    assert t.visible_test_files == t.test_files
    assert t.workdir == "/testbed" and t.image and "octo_1776_lib-1" in t.image
    assert t.repo_path == ""


def test_missing_and_bad_fields_are_named(tmp_path):
    bad = dict(ROW)
    del bad["base_commit"]
    with pytest.raises(TaskFormatError, match="base_commit"):
        RepoTask.from_dict(bad)
    with pytest.raises(TaskFormatError, match="FAIL_TO_PASS"):
        RepoTask.from_dict({**ROW, "FAIL_TO_PASS": "not json"})
    with pytest.raises(TaskFormatError, match="FAIL_TO_PASS"):
        RepoTask.from_dict({**ROW, "FAIL_TO_PASS": []})
    p = tmp_path / "x.jsonl"
    p.write_text("{oops\n")
    with pytest.raises(TaskFormatError, match="x.jsonl:1"):
        load_tasks(p)


def test_save_load_round_trip_resolves_relative_repo_path(tmp_path):
    t = RepoTask.from_dict({**ROW, "repo_path": "repos/lib.git"})
    save_tasks([t], tmp_path / "tasks.jsonl")
    (u,) = load_tasks(tmp_path)
    assert u.repo_path == str(tmp_path / "repos/lib.git")
    assert u.image is None and u.FAIL_TO_PASS == t.FAIL_TO_PASS


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist([ROW, {**ROW, "instance_id": "octo__lib-2"}]), tmp_path / "t.parquet")
    tasks = load_tasks(tmp_path / "t.parquet")
    assert [t.instance_id for t in tasks] == ["octo__lib-1", "octo__lib-2"]
    assert tasks[1].PASS_TO_PASS[1] == "tests/other.py::test_x"
