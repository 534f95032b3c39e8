"""benchmarks/loop_speed.py: its variants are refused clearly before anything runs, and a short real
run of math-tiny's loop yields the figures it prints (tokens/s from metrics.jsonl's steps)."""

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


def test_a_short_real_run_reports_the_steps_tokens_after_the_skipped_ones(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "runs"
    monkeypatch.setattr(sys, "argv", ["loop_speed.py", "--preset", "math-tiny", "--minutes", "0.25", "--skip", "1",
                                      "--variant", "base", "warm_start.examples=0", "--out", str(out),
                                      "--json", str(tmp_path / "f.json")])
    assert _script().main() == 0
    [fig] = json.loads((tmp_path / "f.json").read_text())
    steps = [json.loads(x) for x in (out / "base" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("kind") == "step"]
    used = steps[2:]
    assert fig["steps"] == len(steps) and fig["tokens"] == sum(r["sampled_tokens"] for r in used)
    assert fig["tokens_per_s"] == pytest.approx(fig["tokens"] / (used[-1]["elapsed_s"] - steps[1]["elapsed_s"]))
    assert 0 < fig["cores_busy"] <= 2.5
