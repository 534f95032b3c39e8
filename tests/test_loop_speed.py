"""benchmarks/loop_speed.py: its variants are refused clearly before anything runs, and a short real
run of math-tiny's loop yields the figures it prints (tokens/s from metrics.jsonl's steps), and the
ceiling it prints is the FLOP arithmetic its docstring states, from the model's real shapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "loop_speed.py"


def _script() -> ModuleType:
    return load_benchmark("loop_speed")


def test_a_variant_is_a_name_overrides_and_at_most_one_checkout(tmp_path: Path) -> None:
    parse = _script().parse_variant
    name, overrides, code = parse(["two", "trainer.threads=2", f"@{SCRIPT.parents[1]}"])
    assert (name, overrides, code) == ("two", ["trainer.threads=2"], SCRIPT.parents[1])
    with pytest.raises(SystemExit, match="neither key=value nor @DIR"):
        parse(["x", "threads"])
    with pytest.raises(SystemExit, match="one @DIR at most"):
        parse(["x", "@a", "@b"])
    with pytest.raises(SystemExit, match="not a checkout of this project"):
        parse(["x", f"@{tmp_path}"])


def test_a_short_real_run_reports_the_steps_tokens_after_the_skipped_ones(
    tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "runs"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "loop_speed.py",
            "--preset",
            "math-tiny",
            "--minutes",
            "0.25",
            "--skip",
            "1",
            "--variant",
            "base",
            "warm_start.examples=0",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "f.json"),
        ],
    )
    assert _script().main() == 0
    [fig] = json.loads((tmp_path / "f.json").read_text())
    steps = [json.loads(x) for x in (out / "base" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("kind") == "step"]
    used = steps[2:]
    assert fig["steps"] == len(steps) and fig["tokens"] == sum(r["sampled_tokens"] for r in used)
    assert fig["tokens_per_s"] == pytest.approx(
        fig["tokens"] / (used[-1]["elapsed_s"] - steps[1]["elapsed_s"])
    )
    assert 0 < fig["cores_busy"] <= 2.5
    assert fig["tokens_per_s"] < fig["ceiling"] < fig["no_weight_grad_ceiling"]


def test_model_products_counts_smollm2s_linear_maps_and_its_output_head() -> None:
    m = _script().model_products("smollm2-135m")
    # 30 layers of q, k, v, o (576x576, 576x192 twice, 576x576) and gate, up, down (576x1536 each)
    assert m["body"] == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert m["head"] == 49152 * 576 and (m["hidden"], m["mlp"]) == (576, 1536)


def test_the_ceiling_is_the_stated_flop_arithmetic_over_the_steps_after_the_skipped_ones(
    tmp_path: Path, monkeypatch
) -> None:
    script = _script()
    from fr_agents.config import load_config
    from fr_agents.config_io import dump_config

    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config("math-tiny"), run / "config.yaml")
    steps = [
        {
            "kind": "step",
            "forward_tokens": 100.0 * i,
            "policy_tokens": 40.0 * i,
            "sampled_tokens": 50 * i,
            "tokens": 50 * i,
        }
        for i in range(1, 5)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    # a stand-in for the timed products: 100 GFLOP/s for the learner's chunk, 50 for the engine's step
    monkeypatch.setattr(
        script, "_product_gflops", lambda rows, k, n, dtype, repeat: 100.0 if rows == 1024 else 50.0
    )
    sizes = script.model_products("tiny")
    out = script.ceiling(run, skip=1, cores=2)
    forward, policy, sampled = 700.0, 280.0, 350  # steps 3 and 4: after the skipped one and the first kept
    passes = sizes["body"] * forward + sizes["head"] * policy
    rollout = 2 * (sizes["body"] * forward + sizes["head"] * sampled)
    assert out["ceiling"] == pytest.approx(sampled / ((6 * passes / 100e9 + rollout / 50e9) / 2))
    assert out["no_weight_grad_ceiling"] == pytest.approx(
        sampled / ((4 * passes / 100e9 + rollout / 50e9) / 2)
    )
    assert out["gflop_per_token"] == pytest.approx((6 * passes + rollout) / sampled / 1e9)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "step", "tokens": 5}) + "\n")
    assert script.ceiling(run, skip=0, cores=2) == {}
