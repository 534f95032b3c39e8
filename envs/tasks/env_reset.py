"""``env-reset``: no task list at all; the env's own ``reset(seed=n)`` picks each task.

For envs that draw their tasks themselves (most user envs do): every task is just a reset seed,
stored as ``metadata["reset_seed"]``. The trainer runs such a task as ``env.reset(seed=n)``, with no
``options["task"]``. The held-out split uses seeds from a range that training never reaches, so
an env whose task depends only on the seed is evaluated on tasks RL never sampled by seed (an env
with a small task set may still repeat a task: that is the env's choice). There are no gold answers,
so a warm start is refused with this source.

    get_task_source("env-reset", seed=0, train=10000, test=200)
"""

from __future__ import annotations

from envs.tasks.base import Task, TaskSource, make_task
from fr_agents.config import ConfigError

TEST_SEED_BASE = 1 << 30
"""Held-out reset seeds start here; train seeds lie below it."""


class EnvResetSource(TaskSource):
    """Tasks that are reset seeds (see the module docstring).

    Args:
        train: number of train tasks (reset seeds ``seed * train + i``).
        test: number of held-out tasks (reset seeds ``TEST_SEED_BASE + seed * test + i``).
    """

    name = "env-reset"

    def __init__(self, seed: int = 0, train: int = 10000, test: int = 200) -> None:
        super().__init__(seed)
        if train < 1:
            raise ConfigError(f"tasks.params.train: must be >= 1, got {train}")
        if test < 0:
            raise ConfigError(f"tasks.params.test: must be >= 0, got {test}")
        if seed < 0 or (seed + 1) * train > TEST_SEED_BASE:
            raise ConfigError(f"tasks.seed: train reset seeds must stay below {TEST_SEED_BASE}")
        self.train, self.test = int(train), int(test)

    def _load_split(self, split: str) -> list[Task]:
        if split == "train":
            seeds = range(self.seed * self.train, (self.seed + 1) * self.train)
        elif split == "test":
            start = TEST_SEED_BASE + self.seed * self.test
            seeds = range(start, start + self.test)
        else:
            raise ValueError(f"tasks split: env-reset has train and test, not {split!r}")
        return [make_task(f"reset-{n}", "", "", reset_seed=n) for n in seeds]
