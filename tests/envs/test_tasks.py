"""Task sources: one interface, deterministic seeded splits, clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.tasks import SOURCES, TaskSource, get_task_source
from envs.tasks.champ import verifiable_answer
from envs.tasks.records import gsm8k_answer
from fr_agents.config import ConfigError


def _check_interface(source: TaskSource) -> None:
    train, test = source.split("train"), source.split("test")
    assert len(train) > 0
    for t in list(train)[:20] + list(test)[:20]:
        assert set(t) == {"id", "prompt", "answer", "metadata"}
        assert isinstance(t["prompt"], str) and isinstance(t["answer"], str) and t["answer"]
    assert not {t["id"] for t in train} & {t["id"] for t in test}
    assert [t["id"] for t in source] == [t["id"] for t in train]  # iterating a source = its train split


def test_arithmetic_plain_curriculum() -> None:
    src = get_task_source("arithmetic", seed=0, digits=2)
    _check_interface(src)
    train, test = src.split("train"), src.split("test")
    assert len(train) + len(test) == 100 * 100 and len(test) == 1000
    for t in list(train)[:50]:
        a, op, b = t["metadata"]["a"], t["metadata"]["op"], t["metadata"]["b"]
        assert t["prompt"] == f"{a}+{b}=" and op == "+" and t["answer"] == str(a + b)
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in test}


def test_arithmetic_is_deterministic_and_seeded() -> None:
    a = [t["id"] for t in get_task_source("arithmetic", seed=3, digits=1).split("test")]
    b = [t["id"] for t in get_task_source("arithmetic", seed=3, digits=1).split("test")]
    c = [t["id"] for t in get_task_source("arithmetic", seed=4, digits=1).split("test")]
    assert a == b and a != c


def test_arithmetic_ops_size_curriculum_and_template() -> None:
    src = get_task_source(
        "arithmetic", digits=3, ops=["-", "*"], size=400, order="curriculum", template="What is {a} {op} {b}?"
    )
    train = src.split("train")
    assert len(train) + len(src.split("test")) == 400
    diffs = [t["metadata"]["difficulty"] for t in train]
    assert diffs == sorted(diffs)
    for t in train:
        m = t["metadata"]
        assert t["prompt"] == f"What is {m['a']} {m['op']} {m['b']}?"
        assert int(t["answer"]) == (m["a"] - m["b"] if m["op"] == "-" else m["a"] * m["b"]) >= 0


def test_arithmetic_min_operand_bounds_the_operands() -> None:
    src = get_task_source(
        "arithmetic", digits=4, min_digits=4, ops=["*"], size=500, test_size=50, min_operand=3163
    )
    tasks = list(src.split("train")) + list(src.split("test"))
    assert len(tasks) == 500
    assert all(3163 <= t["metadata"]["a"] <= 9999 and 3163 <= t["metadata"]["b"] <= 9999 for t in tasks)
    assert {len(t["answer"]) for t in tasks} == {8}  # 3163 * 3163 >= 10**7: every product has 8 digits
    assert src.describe()["min_operand"] == 3163
    with pytest.raises(ConfigError, match=r"tasks\.params\.min_operand"):
        get_task_source("arithmetic", digits=2, min_operand=100)


def test_split_stream_and_sample_are_seeded() -> None:
    split = get_task_source("arithmetic", digits=1).split("train")
    s1, s2 = split.stream(seed=1), split.stream(seed=1)
    first = [next(s1)["id"] for _ in range(len(split) + 5)]
    assert first == [next(s2)["id"] for _ in range(len(split) + 5)]
    assert sorted(first[: len(split)]) == sorted(t["id"] for t in split)  # one epoch covers the split
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    assert split.sample(rng_a) == split.sample(rng_b)


def test_jsonl_gsm8k_and_math(tmp_path: Path) -> None:
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(
        "\n".join(
            json.dumps({"question": f"Q{i}: how many?", "answer": f"Work...\n#### {1000 + i:,}"})
            for i in range(20)
        )
    )
    src = get_task_source("jsonl", path=str(gsm), test_fraction=0.25, seed=1)
    _check_interface(src)
    assert len(src.split("test")) == 5
    t = src.split("train")[0]
    assert t["answer"] == str(1000 + int(t["prompt"][1 : t["prompt"].index(":")]))
    assert t["metadata"]["format"] == "gsm8k"

    math_train, math_test = tmp_path / "math_train.jsonl", tmp_path / "math_test.jsonl"
    rec = {
        "problem": "Half of one?",
        "solution": r"First \boxed{2}, no: \boxed{\frac{1}{2}}.",
        "level": "Level 1",
    }
    math_train.write_text(
        json.dumps(rec) + "\n" + json.dumps({"problem": "no answer", "solution": "none"}) + "\n"
    )
    math_test.write_text(json.dumps({**rec, "answer": "0.5"}) + "\n")
    src = get_task_source("jsonl", train_path=str(math_train), test_path=str(math_test))
    (train_task,) = src.split("train")  # the record without a boxed answer is skipped
    assert train_task["answer"] == r"\frac{1}{2}" and train_task["metadata"]["level"] == "Level 1"
    assert src.split("test")[0]["answer"] == "0.5"


def test_jsonl_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tasks.params.path"):
        get_task_source("jsonl", path=str(tmp_path / "missing.jsonl")).split("train")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(ConfigError, match="tasks.params.format"):
        get_task_source("jsonl", path=str(bad)).split("train")


def test_gsm8k_answer_parsing() -> None:
    assert gsm8k_answer("a\n#### 1,234") == "1234"
    assert gsm8k_answer("#### -5.") == "-5"
    assert gsm8k_answer("no marker") is None


def test_reasoning_gym_by_name_and_config() -> None:
    src = get_task_source(
        "reasoning_gym",
        seed=2,
        name="basic_arithmetic",
        config={"min_terms": 2, "max_terms": 2},
        size=30,
        test_size=10,
    )
    _check_interface(src)
    assert len(src.split("train")) == 30
    assert not {t["prompt"] for t in src.split("train")} & {t["prompt"] for t in src.split("test")}
    assert src.split("train")[0]["metadata"]["source"] == "reasoning_gym:basic_arithmetic"
    with pytest.raises(ConfigError, match="reasoning-gym"):
        get_task_source("reasoning_gym", name="no_such_generator").split("train")


def test_champ_keeps_only_auto_verifiable() -> None:
    src = get_task_source("champ", seed=0)
    _check_interface(src)
    everything = list(src.split("train")) + list(src.split("test"))
    assert 50 <= len(everything) < 270
    assert all(verifiable_answer(t["metadata"]["raw_answer"]) == t["answer"] for t in everything)
    assert verifiable_answer("C(10, 5), or equivalently 252") == "252"
    assert verifiable_answer("1,500") == "1500"
    assert verifiable_answer("2^(n-1)") is None and verifiable_answer("No") is None
    assert verifiable_answer("1, 2") is None


def test_hf_source_gives_a_clear_error_without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    src = get_task_source("hf", name="openai/gsm8k", config="main")
    with pytest.raises(ConfigError, match="datasets"):
        src.split("train")
    with pytest.raises(ConfigError, match="offline"):
        get_task_source("math").split("test")  # the MATH preset source names the way out too


def test_unknown_source_param_and_split() -> None:
    with pytest.raises(ConfigError, match="tasks.source"):
        get_task_source("arithmetc")
    with pytest.raises(ConfigError, match=r"tasks.params.digit.*Did you mean: digits"):
        get_task_source("arithmetic", digit=2)
    with pytest.raises(ConfigError, match="split"):
        get_task_source("arithmetic").split("validation")
    with pytest.raises(ConfigError, match="tasks.params.ops"):
        get_task_source("arithmetic", ops=["/"])
    assert {"arithmetic", "reasoning_gym", "jsonl", "hf", "math", "gsm8k", "champ"} <= set(SOURCES)


def test_user_factory_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_tasks.py").write_text(
        "def make(seed=0, n=3):\n"
        "    return [{'id': f't{i}', 'prompt': f'{i}+{i}=', 'answer': str(2 * i)} for i in range(n)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    src = get_task_source("my_tasks:make", n=4)
    assert [t["answer"] for t in src.split("train")] == ["0", "2", "4", "6"]
    assert len(src.split("test")) == 0
