"""Which train tasks the warm start learns from and which the RL phase samples (``warm_start.balance``,
``tasks.balance``).

The split is a pure function of the config and the train split, so a resumed run (and a rollout
process, which builds its own side) picks exactly the same demos and RL prompts::

    >>> stratified_indices([8, 8, 8, 7, 8, 7], 4)   # two of each answer length
    [0, 1, 3, 5]
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from fr_agents.config import TrainConfig

if TYPE_CHECKING:
    from trainer.types import Task


def demo_and_rl_tasks(cfg: TrainConfig, train_tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """The warm-start demos are ``warm_start.examples`` train tasks; RL prompts come from the others,
    in train order, so RL never sees a label and the pool stays unlabelled from its point of view.

    ``warm_start.balance`` picks the demos: ``natural`` the first ones, ``answer_length`` an equal
    share of each gold-answer length (:func:`stratified_indices`). ``tasks.balance`` picks the RL
    prompts among the rest: ``natural`` all of them, ``answer_length`` as many of each length as the
    rarest has (:func:`balanced_indices`).
    """
    n = min(cfg.warm_start.examples, len(train_tasks))
    by_length = "answer_length" in (cfg.warm_start.balance, cfg.tasks.balance)
    keys = [len(t["answer"]) for t in train_tasks] if by_length else []
    picked = stratified_indices(keys, n) if cfg.warm_start.balance == "answer_length" else list(range(n))
    chosen = set(picked)
    rest = [i for i in range(len(train_tasks)) if i not in chosen]
    if cfg.tasks.balance == "answer_length":
        rest = balanced_indices(keys, rest)
    if by_length:
        logging.getLogger(__name__).info(
            "answer lengths (length: tasks): demos %s (warm_start.balance=%s), "
            "RL prompts %s (tasks.balance=%s)",
            dict(sorted(Counter(keys[i] for i in picked).items())),
            cfg.warm_start.balance,
            dict(sorted(Counter(keys[i] for i in rest).items())),
            cfg.tasks.balance,
        )
    demos = [train_tasks[i] for i in picked]
    rl = [train_tasks[i] for i in rest] or list(train_tasks)
    return demos, rl


def stratified_indices(keys: Sequence[Hashable], n: int) -> list[int]:
    """``n`` indices into ``keys``, as many for each distinct key as for any other, each key's taken
    in order; a key with too few items gives all it has and the first items not yet taken fill the
    rest. The result is sorted (train order), so it is deterministic for a given split.

    >>> stratified_indices([8, 8, 8, 7, 8, 7], 4)
    [0, 1, 3, 5]
    """
    by_key = _by_key(keys, range(len(keys)))
    picked: set[int] = set()
    left = min(n, len(keys))
    groups = sorted(by_key.values(), key=len)  # the smallest first, so what they lack goes to the others
    for g_i, idx in enumerate(groups):
        share = left // (len(groups) - g_i)
        take = idx[:share]
        picked.update(take)
        left -= len(take)
    for i in range(len(keys)):
        if left <= 0:
            break
        if i not in picked:
            picked.add(i)
            left -= 1
    return sorted(picked)


def balanced_indices(keys: Sequence[Hashable], among: list[int]) -> list[int]:
    """The indices of ``among`` kept so that every key has as many as the rarest key has: each key's
    first ones, in order; the result is sorted.

    >>> balanced_indices([8, 8, 7, 8, 7, 8], [0, 1, 2, 3, 4, 5])
    [0, 1, 2, 4]
    """
    by_key = _by_key(keys, among)
    if not by_key:
        return []
    m = min(len(v) for v in by_key.values())
    return sorted(i for idx in by_key.values() for i in idx[:m])


def _by_key(keys: Sequence[Hashable], among: Iterable[int]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = {}
    for i in among:
        out.setdefault(keys[i], []).append(i)
    return out
