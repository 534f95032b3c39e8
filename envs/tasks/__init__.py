"""Task sources: where prompts and gold answers come from.

One entry point, used by the config's ``tasks.source`` / ``tasks.params`` / ``tasks.seed``::

    from envs.tasks import get_task_source
    source = get_task_source("arithmetic", seed=0, digits=2)
    train, test = source.split("train"), source.split("test")
    train[0]  # {"id": "arith-70+57", "prompt": "70+57=", "answer": "127", "metadata": {...}}

Built-in sources (see each module for its parameters):

========================  =========================================================
``arithmetic``            the small integer curriculum of the tiny presets ("12+7=")
``reasoning_gym``         a reasoning-gym generator, by ``name`` and ``config``
``jsonl``                 GSM8K- or MATH-shaped JSONL files (``path``)
``hf``                    a Hugging Face ``datasets`` dataset by ``name`` (online)
``math`` / ``gsm8k``      ``hf`` with the MATH / GSM8K hub datasets as defaults (online)
``champ``                 champ-dataset, auto-verifiable part
``env-reset``             no list: each task is a reset seed; the env's own reset picks it
``alfworld``              ALFWorld games (train / valid_seen / valid_unseen), ALFWorld-v0
``repo-coding``           repository coding tasks of RepoCoding-v0 (held out by repo or share)
========================  =========================================================

A user source is named ``"package.module:factory"``; the factory is called with the same keyword
arguments and must return a :class:`TaskSource` (or any iterable of Task dicts, which becomes the
train split).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterable
from typing import Any

from envs.tasks.alfworld import AlfworldSource
from envs.tasks.arithmetic import ArithmeticSource
from envs.tasks.base import Task, TaskSource, TaskSplit, holdout, make_task
from envs.tasks.champ import ChampSource
from envs.tasks.env_reset import EnvResetSource
from envs.tasks.hf import Gsm8kSource, HFDatasetSource, MathDatasetSource
from envs.tasks.jsonl import JsonlSource, read_jsonl_tasks
from envs.tasks.reasoning_gym_source import ReasoningGymSource
from envs.tasks.repo_coding import RepoCodingSource
from fr_agents.config import ConfigError

SOURCES: dict[str, type[TaskSource]] = {
    "arithmetic": ArithmeticSource,
    "reasoning_gym": ReasoningGymSource,
    "jsonl": JsonlSource,
    "hf": HFDatasetSource,
    "math": MathDatasetSource,
    "gsm8k": Gsm8kSource,
    "champ": ChampSource,
    "env-reset": EnvResetSource,
    "alfworld": AlfworldSource,
    "repo-coding": RepoCodingSource,
}
"""Source name -> class. Env owners add their own sources here when they land."""

__all__ = [
    "SOURCES",
    "AlfworldSource",
    "ArithmeticSource",
    "ChampSource",
    "EnvResetSource",
    "Gsm8kSource",
    "HFDatasetSource",
    "JsonlSource",
    "ListSource",
    "MathDatasetSource",
    "ReasoningGymSource",
    "RepoCodingSource",
    "Task",
    "TaskSource",
    "TaskSplit",
    "get_task_source",
    "holdout",
    "make_task",
    "read_jsonl_tasks",
]


class ListSource(TaskSource):
    """Fixed task lists (``train`` and optionally ``test``); wraps what user factories return."""

    name = "list"

    def __init__(self, train: Iterable[Task], test: Iterable[Task] = (), seed: int = 0) -> None:
        super().__init__(seed)
        self._lists = {"train": list(train), "test": list(test)}
        for split, tasks in self._lists.items():
            for i, t in enumerate(tasks):
                missing = {"id", "prompt", "answer"} - set(t)
                if missing:
                    raise ConfigError(f"task {split}[{i}]: missing field(s) {', '.join(sorted(missing))}")

    def _load_split(self, split: str) -> list[Task]:
        return [
            make_task(str(t["id"]), t["prompt"], str(t["answer"]), **dict(t.get("metadata") or {}))
            for t in self._lists[split]
        ]


def _check_params(name: str, cls: type, params: dict[str, Any]) -> None:
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "seed")]
    for key in params:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=2)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"tasks.params.{key}: unknown parameter for source "
                f"'{name}'.{hint} Allowed: {', '.join(allowed)}"
            )


def get_task_source(name: str, /, seed: int = 0, **params: Any) -> TaskSource:
    """The task source called ``name`` (built-in or ``module:factory``), built with ``params``.

    ``name`` is positional-only, so sources may themselves take a ``name`` parameter
    (``get_task_source("hf", name="openai/gsm8k")``).
    """
    if name in SOURCES:
        cls = SOURCES[name]
        _check_params(name, cls, params)
        return cls(seed=seed, **params)
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"tasks.source: cannot import {name!r} ({e})") from e
        made = factory(seed=seed, **params)
        return made if isinstance(made, TaskSource) else ListSource(made, seed=seed)
    close = difflib.get_close_matches(name, list(SOURCES), n=2)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"tasks.source: unknown source {name!r}.{hint} Built-in: {', '.join(SOURCES)}, or 'module:factory'"
    )
