"""How the train split is cut into warm-start demos and RL prompts (``warm_start.examples`` and
``warm_start.stratify``), on the real arithmetic source of python-tool-tiny."""

from __future__ import annotations

from collections import Counter

import pytest

from envs.tasks import get_task_source
from fr_agents.config import ConfigError, load_config
from trainer.parts import demo_and_rl_tasks, stratified_indices


def _train(cfg):
    source = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params)
    return source.split(cfg.tasks.train_split)


def _ids(tasks) -> list[str]:
    return [t["id"] for t in tasks]


def test_without_stratify_the_demos_are_the_first_train_tasks_and_rl_gets_the_rest() -> None:
    cfg = load_config("python-tool-tiny", ["warm_start.examples=50", "warm_start.stratify=first", "tasks.params.size=600"])
    train = _train(cfg)
    demos, rl = demo_and_rl_tasks(cfg, train)
    assert _ids(demos) == _ids(train[:50])
    assert _ids(rl) == _ids(train[50:])


def test_answer_length_stratify_shows_each_length_equally_in_train_order_and_rl_gets_the_rest() -> None:
    cfg = load_config("python-tool-tiny", ["warm_start.examples=40", "warm_start.stratify=answer_length",
                                           "tasks.params.size=600"])
    train = _train(cfg)
    lengths = Counter(len(t["answer"]) for t in train)
    assert set(lengths) == {7, 8} and lengths[7] < lengths[8] / 2  # 4-digit products: 7 digits are a minority
    demos, rl = demo_and_rl_tasks(cfg, train)
    assert Counter(len(t["answer"]) for t in demos) == {7: 20, 8: 20}
    order = {t["id"]: i for i, t in enumerate(train)}
    assert [order[i] for i in _ids(demos)] == sorted(order[i] for i in _ids(demos))  # train order
    for length in (7, 8):  # each length's first 20, not any 20
        first = [t["id"] for t in train if len(t["answer"]) == length][:20]
        assert [i for i in _ids(demos) if len(train[order[i]]["answer"]) == length] == first
    assert not set(_ids(demos)) & set(_ids(rl))
    assert sorted(_ids(demos) + _ids(rl), key=order.get) == _ids(train)
    assert [order[i] for i in _ids(rl)] == sorted(order[i] for i in _ids(rl))


def test_a_length_with_too_few_tasks_gives_all_it_has_and_train_order_fills_the_rest() -> None:
    keys = [8, 8, 8, 8, 7, 8, 8, 6, 8]
    picked = stratified_indices(keys, 6)
    assert len(picked) == 6 and picked == sorted(picked)
    assert Counter(keys[i] for i in picked) == {7: 1, 6: 1, 8: 4}
    assert stratified_indices(keys, 99) == list(range(len(keys)))
    assert stratified_indices([3, 3], 0) == []


def test_an_unknown_stratify_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="warm_start.stratify"):
        load_config("python-tool-tiny", ["warm_start.stratify=digits"])
