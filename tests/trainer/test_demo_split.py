"""How the train split is cut into warm-start demos and RL prompts (``warm_start.examples``,
``warm_start.balance`` and ``tasks.balance``), on the real arithmetic source of python-tool-tiny."""

from __future__ import annotations

from collections import Counter

import pytest

from envs.tasks import get_task_source
from fr_agents.config import ConfigError, load_config
from trainer.task_balance import balanced_indices, demo_and_rl_tasks, stratified_indices


def _train(cfg):
    source = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params)
    return source.split(cfg.tasks.train_split)


def _ids(tasks) -> list[str]:
    return [t["id"] for t in tasks]


def test_natural_balance_gives_the_demos_the_first_train_tasks_and_rl_the_rest() -> None:
    cfg = load_config(
        "python-tool-tiny",
        [
            "warm_start.examples=50",
            "warm_start.balance=natural",
            "tasks.balance=natural",
            "tasks.params.size=600",
        ],
    )
    train = _train(cfg)
    demos, rl = demo_and_rl_tasks(cfg, train)
    assert _ids(demos) == _ids(train[:50])
    assert _ids(rl) == _ids(train[50:])


def test_answer_length_balance_shows_each_length_alike_in_demos_and_rl_prompts_in_train_order() -> None:
    cfg = load_config(
        "python-tool-tiny",
        [
            "warm_start.examples=40",
            "warm_start.balance=answer_length",
            "tasks.balance=answer_length",
            "tasks.params.size=600",
        ],
    )
    train = _train(cfg)
    lengths = Counter(len(t["answer"]) for t in train)
    assert set(lengths) == {7, 8} and lengths[7] < lengths[8] / 2  # 4-digit products: 7 digits are a minority
    demos, rl = demo_and_rl_tasks(cfg, train)
    order = {t["id"]: i for i, t in enumerate(train)}
    by_length = {n: [t["id"] for t in train if len(t["answer"]) == n] for n in (7, 8)}
    # demos: 20 of each length, each length's first 20
    assert Counter(len(t["answer"]) for t in demos) == {7: 20, 8: 20}
    for n in (7, 8):
        assert [t["id"] for t in demos if len(t["answer"]) == n] == by_length[n][:20]
    # RL prompts: every 7-digit task left, and as many 8-digit ones, the first not used as demos
    assert Counter(len(t["answer"]) for t in rl) == {7: lengths[7] - 20, 8: lengths[7] - 20}
    assert [t["id"] for t in rl if len(t["answer"]) == 7] == by_length[7][20:]
    assert [t["id"] for t in rl if len(t["answer"]) == 8] == by_length[8][20 : lengths[7]]
    for part in (demos, rl):
        assert [order[i] for i in _ids(part)] == sorted(order[i] for i in _ids(part))  # train order
    assert not set(_ids(demos)) & set(_ids(rl))


def test_each_balance_acts_on_its_own_part_of_the_split() -> None:
    base = ["warm_start.examples=40", "tasks.params.size=600"]
    demos_only = load_config(
        "python-tool-tiny", [*base, "warm_start.balance=answer_length", "tasks.balance=natural"]
    )
    train = _train(demos_only)
    demos, rl = demo_and_rl_tasks(demos_only, train)
    assert Counter(len(t["answer"]) for t in demos) == {7: 20, 8: 20}
    assert _ids(rl) == [i for i in _ids(train) if i not in set(_ids(demos))]  # RL: all the rest
    rl_only = load_config(
        "python-tool-tiny", [*base, "warm_start.balance=natural", "tasks.balance=answer_length"]
    )
    demos, rl = demo_and_rl_tasks(rl_only, train)
    assert _ids(demos) == _ids(train[:40])
    counts = Counter(len(t["answer"]) for t in rl)
    assert counts[7] == counts[8] == sum(len(t["answer"]) == 7 for t in train[40:])


def test_a_length_with_too_few_tasks_gives_all_it_has_and_train_order_fills_the_rest() -> None:
    keys = [8, 8, 8, 8, 7, 8, 8, 6, 8]
    picked = stratified_indices(keys, 6)
    assert len(picked) == 6 and picked == sorted(picked)
    assert Counter(keys[i] for i in picked) == {7: 1, 6: 1, 8: 4}
    assert stratified_indices(keys, 99) == list(range(len(keys)))
    assert stratified_indices([3, 3], 0) == []
    assert balanced_indices(keys, [0, 1, 2, 3, 4, 5, 6, 7, 8]) == [0, 4, 7]
    assert balanced_indices(keys, [1, 2, 4]) == [1, 4]  # only the indices given count: one 8, one 7
    assert balanced_indices(keys, []) == []


def test_an_unknown_balance_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="tasks.balance"):
        load_config("python-tool-tiny", ["tasks.balance=digits"])
    with pytest.raises(ConfigError, match="warm_start.balance"):
        load_config("python-tool-tiny", ["warm_start.balance=digits"])
