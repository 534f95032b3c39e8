"""Tasks from a Hugging Face ``datasets`` dataset, by name (for users who are online).

Parameters: ``name`` (e.g. ``"openai/gsm8k"``), ``config`` (e.g. ``"main"``), ``format`` (as for
JSONL: ``auto``, ``gsm8k``, ``math``, ``plain``), ``train_split`` / ``test_split`` (the dataset's
split names, default ``train`` / ``test``), ``limit``. Without the ``datasets`` package or without
network access this raises a :class:`ConfigError` that says so; nothing is downloaded at import.
"""

from __future__ import annotations

from typing import Any

from envs.tasks.base import Task, TaskSource
from envs.tasks.records import record_to_task
from fr_agents.config import ConfigError


class HFDatasetSource(TaskSource):
    """A GSM8K/MATH/prompt-answer shaped dataset loaded with ``datasets.load_dataset``."""

    name = "hf"

    def __init__(
        self,
        seed: int = 0,
        name: str | None = None,
        config: str | None = None,
        format: str = "auto",
        train_split: str = "train",
        test_split: str = "test",
        limit: int | None = None,
    ) -> None:
        super().__init__(seed)
        if not name:
            raise ConfigError("tasks.params.name: the HF dataset name is required (e.g. openai/gsm8k)")
        self.dataset_name, self.config, self.format = name, config, format
        self.hf_splits = {"train": train_split, "test": test_split}
        self.limit = limit

    def _load_split(self, split: str) -> list[Task]:
        try:
            import datasets
        except ImportError as e:
            raise ConfigError(
                f"tasks.source=hf: the 'datasets' package is not installed (pip install datasets) "
                f"to load {self.dataset_name!r}; offline, export it to JSONL and use tasks.source=jsonl"
            ) from e
        hf_split = self.hf_splits[split]
        try:
            ds: Any = datasets.load_dataset(self.dataset_name, self.config, split=hf_split)
        except Exception as e:  # noqa: BLE001 - network, auth and name errors all end here
            raise ConfigError(
                f"tasks.params.name: could not load HF dataset {self.dataset_name!r} "
                f"(config={self.config!r}, split={hf_split!r}): {type(e).__name__}: "
                f"{e}. Are you offline? Use tasks.source=jsonl with a local file."
            ) from e
        tasks: list[Task] = []
        for i, rec in enumerate(ds):
            task = record_to_task(
                dict(rec), f"{self.dataset_name}-{hf_split}-{i}", self.format, source=self.dataset_name
            )
            if task is not None:
                tasks.append(task)
            if self.limit is not None and len(tasks) >= self.limit:
                break
        return tasks


class MathDatasetSource(HFDatasetSource):
    """``math``: the MATH competition set (Hendrycks et al.) from the hub; answers from ``\\boxed{}``.

    Same parameters as ``hf`` with MATH defaults; offline, use ``jsonl`` with a local copy.
    """

    name = "math"

    def __init__(
        self,
        seed: int = 0,
        name: str | None = "DigitalLearningGmbH/MATH-lighteval",
        config: str | None = "default",
        format: str = "math",
        train_split: str = "train",
        test_split: str = "test",
        limit: int | None = None,
    ) -> None:
        super().__init__(seed, name, config, format, train_split, test_split, limit)


class Gsm8kSource(HFDatasetSource):
    """``gsm8k``: grade-school math word problems from the hub; answers after ``####``."""

    name = "gsm8k"

    def __init__(
        self,
        seed: int = 0,
        name: str | None = "openai/gsm8k",
        config: str | None = "main",
        format: str = "gsm8k",
        train_split: str = "train",
        test_split: str = "test",
        limit: int | None = None,
    ) -> None:
        super().__init__(seed, name, config, format, train_split, test_split, limit)
