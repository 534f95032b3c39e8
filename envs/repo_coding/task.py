"""The task format (SWE-bench instance fields plus sandbox set-up) and its loaders.

A :class:`RepoTask` carries the SWE-bench fields ``instance_id, repo, base_commit,
problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS`` and what our sandbox needs to
set the repository up:

* ``repo_path`` — a git repository (usually bare) holding ``base_commit``; relative paths are
  resolved against the task file's folder. Tasks built by :mod:`envs.repo_coding.builder` use this.
* ``image`` / ``workdir`` — for users who bring their own SWE-bench images: the repository is
  already inside ``image`` at ``workdir`` (SWE-bench uses ``/testbed``) and ``repo_path`` is empty.
* ``test_files`` — the test files the grader runs (the node ids in FAIL_TO_PASS / PASS_TO_PASS live
  there) and ``visible_test_files`` — what the agent's ``run_tests`` tool runs.

:func:`load_tasks` reads SWE-bench style JSONL or parquet (parquet needs ``pyarrow``). SWE-bench
on the Hub stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; both forms are accepted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


class TaskFormatError(ValueError):
    """A task record is missing a field or has one of the wrong type (the message names it)."""


@dataclass
class RepoTask:
    """One repository-level coding task (see the module docstring for the fields)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    repo_path: str = ""
    image: str | None = None
    workdir: str = "/work/repo"
    test_files: list[str] = field(default_factory=list)
    visible_test_files: list[str] = field(default_factory=list)
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    mutation: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, row: dict[str, Any], base_dir: str | Path | None = None) -> RepoTask:
        """Validate ``row`` and build a task; ``base_dir`` resolves a relative ``repo_path``."""
        if not isinstance(row, dict):
            raise TaskFormatError(f"a task must be a JSON object, got {type(row).__name__}")
        name = row.get("instance_id", "<no instance_id>")
        for key in REQUIRED:
            if key not in row or row[key] is None:
                raise TaskFormatError(f"task {name}: missing field {key!r}")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in row.items() if k in known}
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_files", "visible_test_files"):
            if key in kw:
                kw[key] = _str_list(kw[key], key, name)
        for key in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch"):
            if not isinstance(kw[key], str):
                raise TaskFormatError(f"task {name}: field {key!r} must be a string")
        if not kw["FAIL_TO_PASS"]:
            raise TaskFormatError(f"task {name}: field 'FAIL_TO_PASS' is empty")
        if not kw.get("test_files"):
            kw["test_files"] = sorted({nid.split("::")[0] for nid in kw["FAIL_TO_PASS"] + kw["PASS_TO_PASS"]})
        if not kw.get("visible_test_files"):
            kw["visible_test_files"] = list(kw["test_files"])
        if kw.get("repo_path") and base_dir is not None and not Path(kw["repo_path"]).is_absolute():
            kw["repo_path"] = str(Path(base_dir) / kw["repo_path"])
        if not kw.get("repo_path") and not kw.get("image"):
            # A plain SWE-bench row: the repository lives in the instance image at /testbed.
            kw["image"] = swebench_image(kw["instance_id"])
            kw.setdefault("workdir", "/testbed")
            if kw["workdir"] == "/work/repo":
                kw["workdir"] = "/testbed"
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def swebench_image(instance_id: str) -> str:
    """The public SWE-bench evaluation image name of an instance (its repo lives at /testbed)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def _str_list(value: Any, key: str, name: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"task {name}: field {key!r} is a string but not a JSON list ({e})") from e
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TaskFormatError(f"task {name}: field {key!r} must be a list of strings")
    return list(value)


def load_tasks(path: str | Path) -> list[RepoTask]:
    """Tasks from a ``.jsonl`` / ``.json`` / ``.parquet`` file, or a folder holding ``tasks.jsonl``."""
    p = Path(path)
    if p.is_dir():
        p = p / "tasks.jsonl"
    if not p.exists():
        raise FileNotFoundError(
            f"no task file at {p} (build one with `fr-agents repo-tasks build --out DIR`)"
        )
    rows: list[dict[str, Any]]
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError("reading parquet task files needs pyarrow: pip install pyarrow") from e
        rows = pq.read_table(p).to_pylist()
    elif p.suffix == ".json":
        rows = json.loads(p.read_text())
        if not isinstance(rows, list):
            raise TaskFormatError(f"{p}: a .json task file must hold a list of tasks")
    else:
        rows = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskFormatError(f"{p}:{i}: not valid JSON ({e.msg})") from e
    return [RepoTask.from_dict(r, base_dir=p.parent) for r in rows]


def save_tasks(tasks: list[RepoTask], path: str | Path) -> None:
    """Write ``tasks`` as JSONL (``repo_path`` is written as given: keep it relative for portability)."""
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), sort_keys=True) + "\n")
