"""Tasks from the CHAMP competition-math dataset (``champ-dataset``), auto-verifiable part only.

CHAMP's 270 problems have free-form answers such as ``"2^(n-1)"``, ``"No"`` or
``"C(10, 5), or equivalently 252"``. We keep a problem only when a single number can be read off
the answer: a plain integer/decimal/fraction, or the number after ``", or equivalently"``. That
leaves about a third of the set, each checkable by math-verify without a human.

Parameters: ``version`` (``"v0"``), ``categories`` (a list to keep, e.g. ``["Combinatorics"]``;
default all), ``test_fraction`` (default 0.2).
"""

from __future__ import annotations

import re

from envs.tasks.base import Task, TaskSource, holdout, make_task
from fr_agents.config import ConfigError

_NUMBER = r"-?\d+(?:\.\d+)?(?:/\d+)?"
_NUMBER_RE = re.compile(rf"^{_NUMBER}$")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+$")
_EQUIV_RE = re.compile(rf",\s*or equivalently\s+({_NUMBER})\s*$")


def verifiable_answer(answer: str) -> str | None:
    """The single number a CHAMP answer states, or None when it is not auto-verifiable."""
    a = answer.strip().rstrip(".")
    if _THOUSANDS_RE.match(a):
        return a.replace(",", "")
    if _NUMBER_RE.match(a):
        return a
    m = _EQUIV_RE.search(a)
    return m.group(1) if m else None


class ChampSource(TaskSource):
    """The auto-verifiable subset of CHAMP."""

    name = "champ"

    def __init__(
        self,
        seed: int = 0,
        version: str = "v0",
        categories: list[str] | None = None,
        test_fraction: float = 0.2,
    ) -> None:
        super().__init__(seed)
        self.version, self.categories, self.test_fraction = version, categories, test_fraction
        self._splits: tuple[list[Task], list[Task]] | None = None

    def all_tasks(self) -> list[Task]:
        try:
            import champ_dataset
        except ImportError as e:
            raise ConfigError("tasks.source=champ: pip install champ-dataset") from e
        try:
            ds = champ_dataset.load(self.version)
        except FileNotFoundError as e:
            raise ConfigError(f"tasks.params.version: champ-dataset has no version {self.version!r}") from e
        tasks: list[Task] = []
        for pid in sorted(ds.problems):
            p = ds.problems[pid]
            if self.categories is not None and p.category not in self.categories:
                continue
            gold = verifiable_answer(p.answer)
            if gold is not None:
                tasks.append(
                    make_task(f"champ-{pid}", p.text, gold, category=p.category, raw_answer=p.answer)
                )
        return tasks

    def _load_split(self, split: str) -> list[Task]:
        if self._splits is None:
            self._splits = holdout(self.all_tasks(), self.seed, self.test_fraction)
        return self._splits[0] if split == "train" else self._splits[1]
