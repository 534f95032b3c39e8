"""The one task interface: a source yields dicts ``{id, prompt, answer, metadata}`` per split.

Every source (arithmetic, reasoning-gym, JSONL, HF datasets, champ) subclasses :class:`TaskSource`
and implements only :meth:`TaskSource._load_split`. Users then write::

    source = get_task_source("arithmetic", digits=2, seed=0)
    for task in source.split("train"):      # a TaskSplit: a list-like of Task dicts
        ...
    task = source.split("test").sample(rng)  # or draw one with a numpy Generator

Splits are deterministic functions of the source's parameters and ``seed``; the held-out split
never shares an ``id`` (nor, for generated sources, a prompt) with the training split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, TypedDict, overload

import numpy as np

from fr_agents.config import ConfigError


class Task(TypedDict):
    """One problem: a stable ``id``, the ``prompt`` shown to the agent, the gold ``answer``."""

    id: str
    prompt: str
    answer: str
    metadata: dict[str, Any]


def make_task(id: str, prompt: str, answer: str, **metadata: Any) -> Task:
    """Build a :class:`Task`, checking the types of the three text fields."""
    for field, value in (("id", id), ("prompt", prompt), ("answer", answer)):
        if not isinstance(value, str):
            raise TypeError(f"task {field}: expected str, got {type(value).__name__}")
    return Task(id=id, prompt=prompt, answer=answer, metadata=dict(metadata))


class TaskSplit(Sequence[Task]):
    """An immutable, indexable list of tasks of one split, with seeded ways to draw from it."""

    def __init__(self, name: str, tasks: list[Task]) -> None:
        self.name = name
        self._tasks = list(tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    @overload
    def __getitem__(self, i: int) -> Task: ...
    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...
    def __getitem__(self, i: int | slice) -> Task | list[Task]:
        return self._tasks[i]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)

    def __repr__(self) -> str:
        return f"TaskSplit({self.name!r}, {len(self)} tasks)"

    def sample(self, rng: np.random.Generator) -> Task:
        """One task drawn uniformly with ``rng``."""
        if not self._tasks:
            raise ValueError(f"split '{self.name}' is empty")
        return self._tasks[int(rng.integers(len(self._tasks)))]

    def shuffled(self, seed: int) -> list[Task]:
        """All tasks in a seeded random order."""
        order = np.random.default_rng(seed).permutation(len(self._tasks))
        return [self._tasks[i] for i in order]

    def stream(self, seed: int = 0) -> Iterator[Task]:
        """Endless epochs over the split, each in a fresh seeded order (for training loops)."""
        if not self._tasks:
            raise ValueError(f"split '{self.name}' is empty")
        epoch = 0
        while True:
            yield from self.shuffled(seed * 1_000_003 + epoch)
            epoch += 1


def holdout(
    items: list[Any], seed: int, test_fraction: float | None = None, test_size: int | None = None
) -> tuple[list[Any], list[Any]]:
    """Split ``items`` into (train, test) by a seeded permutation; train keeps the input order."""
    n = len(items)
    if test_size is None:
        frac = 0.1 if test_fraction is None else float(test_fraction)
        if not 0.0 <= frac < 1.0:
            raise ConfigError(f"tasks.params.test_fraction: must lie in [0, 1), got {frac}")
        test_size = int(round(n * frac))
    if not 0 <= test_size <= n:
        raise ConfigError(f"tasks.params.test_size: must lie in [0, {n}], got {test_size}")
    perm = np.random.default_rng(seed).permutation(n)
    test_idx = set(int(i) for i in perm[:test_size])
    train = [x for i, x in enumerate(items) if i not in test_idx]
    test = [items[i] for i in sorted(test_idx)]
    return train, test


class TaskSource(ABC):
    """A named family of tasks with ``train`` and ``test`` splits.

    Subclasses set ``name`` and implement :meth:`_load_split`; splits are built once and cached.
    Iterating a source iterates its training split.
    """

    name: ClassVar[str] = "source"
    split_names: ClassVar[tuple[str, ...]] = ("train", "test")

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self._cache: dict[str, TaskSplit] = {}

    @abstractmethod
    def _load_split(self, split: str) -> list[Task]:
        """Return the tasks of ``split`` (one of :attr:`split_names`)."""

    def split(self, name: str = "train") -> TaskSplit:
        """The tasks of split ``name`` (``train`` or ``test``)."""
        if name not in self.split_names:
            raise ConfigError(
                f"tasks split: unknown split {name!r} for source "
                f"'{self.name}'; choose from {', '.join(self.split_names)}"
            )
        if name not in self._cache:
            self._cache[name] = TaskSplit(name, self._load_split(name))
        return self._cache[name]

    def __iter__(self) -> Iterator[Task]:
        return iter(self.split("train"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(seed={self.seed})"
