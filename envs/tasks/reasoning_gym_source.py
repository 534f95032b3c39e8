"""Tasks from reasoning-gym's procedural generators, chosen by name and config.

Parameters: ``name`` (a reasoning-gym dataset, e.g. ``"basic_arithmetic"``, ``"chain_sum"``),
``config`` (that generator's keyword arguments), ``size`` (train problems, default 1000),
``test_size`` (default 200). The train split uses ``seed`` and the test split a different seed;
test problems whose question also occurs in train are dropped, so the splits never overlap.
Gold answers are reasoning-gym's ``answer`` strings.

Grading: a dataset whose class defines its own ``score_answer(answer, entry)`` (spell_backward,
word_sorting, letter_jumble, sentence_reordering, chain_sum...) is graded by that scorer
(:func:`task_scorer`), so an answer is judged the way the task defines it and not by math-verify,
which would read a word as a product of letters (the question's letters echoed in any order would
then equal the gold). Only a full score (1.0) is a success: these scorers give partial credit for
things an unsolved echo has (the right words in the wrong order, any non-empty answer), so a
partial score is kept in ``info["scorer_score"]`` and pays nothing. Datasets that keep
reasoning-gym's generic scorer (exact string match, with a length-ratio credit for an answer that
*contains* the gold) are graded like any other gold by :mod:`envs.answer_forms` (a number needs a
number literal, words are compared as normalized strings).

What the scorer needs travels in the task's metadata, never in the prompt: ``rg_dataset`` and
``rg_config`` (to rebuild the scorer) and ``rg`` (the entry's own metadata, e.g. ``sorted_words``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
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
                rg_dataset=self.dataset_name,
                rg_config=_jsonable(self.config),
            )
            for i, x in enumerate(items)
        ]


@functools.lru_cache(maxsize=64)
def _dataset_scorer(name: str, config_json: str) -> Callable[[str, dict], float] | None:
    """The ``score_answer`` of dataset ``name`` built with ``config``, or None when the dataset
    keeps reasoning-gym's generic scorer (one small instance per name and config, cached)."""
    import reasoning_gym
    from reasoning_gym.dataset import ProceduralDataset

    ds = reasoning_gym.create_dataset(name, seed=0, size=1, **json.loads(config_json))
    if type(ds).score_answer is ProceduralDataset.score_answer:
        return None
    return ds.score_answer


def task_scorer(task: Task) -> Callable[[str], float] | None:
    """``answer -> score in [0, 1]`` by the task's own reasoning-gym scorer, or None when the task
    is not a reasoning-gym task or its dataset has no scorer of its own (module docstring)."""
    meta = task.get("metadata") or {}
    name = meta.get("rg_dataset")
    if not name:
        return None
    scorer = _dataset_scorer(str(name), json.dumps(meta.get("rg_config") or {}, sort_keys=True))
    if scorer is None:
        return None
    entry = {"question": task["prompt"], "answer": task["answer"], "metadata": meta.get("rg") or {}}
    return lambda answer: scorer(answer, entry)
