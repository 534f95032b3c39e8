"""Tasks from JSONL files shaped like GSM8K (question/answer with ``#### n``), MATH
(problem/solution with ``\\boxed{}``) or plain prompt/answer; see :mod:`envs.tasks.records`.

Parameters: ``path`` (one file, split by a seeded hold-out of ``test_fraction``) or ``train_path``
and ``test_path`` (files used as given); ``format`` (``auto``, ``gsm8k``, ``math``, ``plain``);
``limit`` (keep the first N usable records of each file). Records without an extractable answer
are skipped and counted in the log.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from envs.tasks.base import Task, TaskSource, holdout
from envs.tasks.records import record_to_task
from fr_agents.config import ConfigError

log = logging.getLogger(__name__)


def read_jsonl_tasks(path: str | Path, fmt: str = "auto", limit: int | None = None) -> list[Task]:
    """Every usable record of the JSONL file at ``path`` as a Task (ids default to ``<stem>-<line>``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"tasks.params.path: no such file: {p}")
    tasks: list[Task] = []
    skipped = 0
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"tasks.params.path: {p}:{lineno} is not valid JSON ({e.msg})") from e
            if not isinstance(rec, dict):
                raise ConfigError(f"tasks.params.path: {p}:{lineno} is not a JSON object")
            task = record_to_task(rec, f"{p.stem}-{lineno}", fmt, source=str(p), line=lineno)
            if task is None:
                skipped += 1
                continue
            tasks.append(task)
            if limit is not None and len(tasks) >= limit:
                break
    if skipped:
        log.info("%s: skipped %d records without an extractable answer", p, skipped)
    return tasks


class JsonlSource(TaskSource):
    """GSM8K/MATH-shaped JSONL files."""

    name = "jsonl"

    def __init__(
        self,
        seed: int = 0,
        path: str | None = None,
        train_path: str | None = None,
        test_path: str | None = None,
        format: str = "auto",
        test_fraction: float = 0.1,
        limit: int | None = None,
    ) -> None:
        super().__init__(seed)
        if path is None and train_path is None:
            raise ConfigError("tasks.params.path: give path (one file) or train_path/test_path")
        self.path, self.train_path, self.test_path = path, train_path, test_path
        self.format, self.test_fraction, self.limit = format, test_fraction, limit

    def _load_split(self, split: str) -> list[Task]:
        if self.path is not None:
            train, test = holdout(
                read_jsonl_tasks(self.path, self.format, self.limit), self.seed, self.test_fraction
            )
            return train if split == "train" else test
        chosen = self.train_path if split == "train" else self.test_path
        if chosen is None:
            raise ConfigError(f"tasks.params.{split}_path: not set, so the source has no '{split}' split")
        return read_jsonl_tasks(chosen, self.format, self.limit)
