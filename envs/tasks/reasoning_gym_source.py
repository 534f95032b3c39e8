"""Tasks from reasoning-gym's procedural generators, chosen by name and config.

Parameters: ``name`` (a reasoning-gym dataset, e.g. ``"basic_arithmetic"``, ``"chain_sum"``),
``config`` (that generator's keyword arguments), ``size`` (train problems, default 1000),
``test_size`` (default 200). The train split uses ``seed`` and the test split a different seed;
test problems whose question also occurs in train are dropped, so the splits never overlap.
Gold answers are reasoning-gym's ``answer`` strings (numbers for the arithmetic families, which
math-verify checks; free-text families are better scored by reasoning-gym itself).
"""

from __future__ import annotations

from typing import Any

from envs.tasks.base import Task, TaskSource, make_task
from fr_agents.config import ConfigError

_TEST_SEED_OFFSET = 1_000_003


def _jsonable(value: Any) -> Any:
    """Metadata kept only where it is plain data (reasoning-gym sometimes stores objects)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


class ReasoningGymSource(TaskSource):
    """A reasoning-gym generator as a task source."""

    name = "reasoning_gym"

    def __init__(
        self,
        seed: int = 0,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        size: int = 1000,
        test_size: int = 200,
    ) -> None:
        super().__init__(seed)
        if not name:
            raise ConfigError(
                "tasks.params.name: the reasoning-gym dataset name is required (e.g. basic_arithmetic)"
            )
        if size < 1 or test_size < 0:
            raise ConfigError(
                f"tasks.params.size/test_size: need size >= 1 and test_size >= 0, got {size}, {test_size}"
            )
        self.dataset_name, self.config = name, dict(config or {})
        self.size, self.test_size = size, test_size

    def _generate(self, seed: int, size: int) -> list[dict[str, Any]]:
        try:
            import reasoning_gym
        except ImportError as e:
            raise ConfigError("tasks.source=reasoning_gym: pip install reasoning-gym") from e
        try:
            ds = reasoning_gym.create_dataset(self.dataset_name, seed=seed, size=size, **self.config)
        except (KeyError, ValueError, TypeError, AssertionError) as e:
            raise ConfigError(
                f"tasks.params: reasoning-gym rejected name={self.dataset_name!r} config={self.config!r}: {e}"
            ) from e
        return [ds[i] for i in range(size)]

    def _load_split(self, split: str) -> list[Task]:
        if split == "train":
            items, tag = self._generate(self.seed, self.size), "train"
        else:
            if self.test_size == 0:
                return []
            train_q = {t["prompt"] for t in self.split("train")}
            items = [
                x
                for x in self._generate(self.seed + _TEST_SEED_OFFSET, self.test_size)
                if x["question"] not in train_q
            ]
            tag = "test"
        return [
            make_task(
                f"rg-{self.dataset_name}-{tag}-{self.seed}-{i}",
                str(x["question"]),
                str(x["answer"]),
                source=f"reasoning_gym:{self.dataset_name}",
                rg=_jsonable(x.get("metadata", {})),
            )
            for i, x in enumerate(items)
        ]
