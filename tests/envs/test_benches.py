"""Bench definitions resolve to the right env, kwargs and fixed problem lists; bad names fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.benches import eval_bench_for, list_benches, resolve_bench
from envs.tasks import get_task_source
from fr_agents.config import ConfigError, load_config


def test_arithmetic_is_the_math_tiny_preset_test_split() -> None:
    bench = resolve_bench("arithmetic")
    cfg = load_config("math-tiny")
    test = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params).split("test")
    assert [it.id for it in bench.items] == [t["id"] for t in test]
    assert bench.env_id == cfg.env.id and bench.env_kwargs == cfg.env.kwargs
    assert bench.max_new_tokens == cfg.rollout.max_new_tokens and bench.primary == "mean@k"
    assert bench.items[0].options == {"task": dict(test[0])}
    # --limit: a seeded sample, not the first N in stored order (which is sorted by operand)
    limited = [it.id for it in resolve_bench("arithmetic", 5).items]
    assert len(set(limited)) == 5 and set(limited) <= {t["id"] for t in test}
    assert limited != [t["id"] for t in test[:5]] and limited == [
        it.id for it in resolve_bench("arithmetic", 5).items
    ]
    assert limited == [it.id for it in bench.subset(5, 0).items]


def test_training_held_out_sample_is_the_eval_limit_sample(tmp_path: Path) -> None:
    """`fr-agents eval --bench arithmetic --limit N` and math-tiny's held-out evaluation (N tasks)
    evaluate the same problems, in the same order."""
    from trainer.evaluate import HeldOutEval

    cfg = load_config("math-tiny", ["trainer.eval_episodes=50"])
    held = HeldOutEval.from_config(cfg, tmp_path, eval_bench_for(cfg))
    assert [it.id for it in held.bench.items] == [it.id for it in resolve_bench("arithmetic", 50).items]


def test_named_and_prefixed_benches() -> None:
    he = resolve_bench("humaneval")
    assert he.env_id == "fr_agents/HumanEval-v0" and len(he.items) == 164 and he.primary == "pass@k"
    champ = resolve_bench("champ")
    assert (
        champ.env_id == "fr_agents/MathVerifier-v0"
        and champ.env_kwargs["answer_format"] == "boxed"
        and len(champ.items) > 50
    )
    rg = resolve_bench("rg:basic_arithmetic")
    assert rg.name == "rg:basic_arithmetic" and len(rg.items) > 100
    assert [it.id for it in rg.items] == [
        it.id for it in resolve_bench("rg:basic_arithmetic").items
    ]  # fixed seed
    preset = resolve_bench("preset:math-tiny", 3)
    assert [it.id for it in preset.items] == [it.id for it in resolve_bench("arithmetic", 3).items]


def test_jsonl_bench_reads_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {i}+1?", "answer": f"Add one.\n#### {i + 1}"} for i in range(7)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    bench = resolve_bench(f"jsonl:{path}")
    assert len(bench.items) == 7
    task = bench.items[3].options["task"]
    assert task["prompt"] == "What is 3+1?" and task["answer"] == "4"
    with pytest.raises(ConfigError, match="no such file"):
        resolve_bench(f"jsonl:{tmp_path / 'missing.jsonl'}")


def test_env_id_with_a_split_lists_the_env_problems() -> None:
    bench = resolve_bench("fr_agents/MathVerifier-v0:test", 4)
    assert bench.env_kwargs == {"split": "test"} and len(bench.items) == 4
    assert bench.items[0].options["task"]["prompt"].endswith("=")
    with pytest.raises(ConfigError, match="not a registered env id"):
        resolve_bench("fr_agents/MathVerifer-v0:test")


def test_unknown_bench_names_suggest_close_ones() -> None:
    with pytest.raises(ConfigError, match="Did you mean: humaneval"):
        resolve_bench("humaneva")
    with pytest.raises(ConfigError, match="missing the part after 'rg:'"):
        resolve_bench("rg:")
    names = [n for n, _ in list_benches()]
    assert {"arithmetic", "humaneval", "champ", "alfworld-seen", "alfworld-unseen", "repo-coding"} <= set(
        names
    )


def test_eval_bench_for_config_defaults_to_the_config_test_split() -> None:
    cfg = load_config("math-tiny", ["trainer.eval_k=2"])
    assert eval_bench_for(cfg).items[0].id == resolve_bench("arithmetic").items[0].id
    cfg = load_config("math-tiny", ["trainer.eval_bench=champ"])
    assert eval_bench_for(cfg).name == "champ"


def test_env_kwargs_that_chose_the_items_cannot_be_changed() -> None:
    """`--env-kwargs` merges over a bench's env kwargs, except those its items were chosen by: a
    bench of one split's problems with another `split` would silently run the same problems."""
    bench = resolve_bench("fr_agents/MathVerifier-v0:test", 3)
    assert bench.item_kwargs == ("split",)
    merged = bench.with_env_kwargs({"answer_format": "plain"})
    assert merged.env_kwargs == {"split": "test", "answer_format": "plain"} and merged.items == bench.items
    assert bench.env_kwargs == {"split": "test"}  # the original is unchanged
    with pytest.raises(
        ValueError, match=r"^split: bench 'fr_agents/MathVerifier-v0:test' chose its items by split='test'"
    ):
        bench.with_env_kwargs({"split": "train", "answer_format": "plain"})


def test_evaluations_during_rl_play_the_first_games_of_the_sample(tmp_path: Path) -> None:
    """trainer.eval_during_episodes: an evaluation every eval_every steps plays the first N problems
    of the held-out sample (the same ones at every step); the other evaluations play all of it."""
    from fr_agents.models import load_policy
    from trainer.evaluate import HeldOutEval

    cfg = load_config("math-tiny", ["trainer.eval_episodes=12", "trainer.eval_during_episodes=5"])
    held = HeldOutEval.from_config(cfg, tmp_path, eval_bench_for(cfg))
    assert [it.id for it in held.during.items] == [it.id for it in held.bench.items][:5]
    model, tok = load_policy("tiny", "float32", "cpu")
    during = held.run("during", 10, model, tok, during=True)
    after = held.run("after_rl", 20, model, tok)
    assert (during["episodes"], after["episodes"]) == (5, 12)
    played = [
        json.loads(line)["task_id"]
        for line in (tmp_path / "evals" / "samples" / "during_step000010")
        .glob("*.jsonl")
        .__next__()
        .read_text()
        .splitlines()
    ]
    assert sorted(played) == sorted(it.id for it in held.bench.items[:5])
