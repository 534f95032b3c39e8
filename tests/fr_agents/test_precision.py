"""``auto`` precision (fr_agents/models/precision.py): bfloat16 only where the device runs it in
hardware, the same verdict in every reader of the config, and a warning before work starts where a
config asks for bfloat16 on a CPU that would emulate it.

Which CPU runs these tests is not ours to choose, so the tests that need the other verdict stand a
fixed answer in for :func:`bfloat16_support` (a stand-in for hardware we may not have; named so)."""

from __future__ import annotations

import platform

import pytest
import torch

from fr_agents.config import ConfigError, config_from_dict, load_config
from fr_agents.models import precision
from trainer.preflight import dry_run_report, precision_notes


def _hardware(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Stand-in: the device runs bfloat16 in hardware (``fast``) or emulates it."""
    monkeypatch.setattr(
        precision,
        "bfloat16_support",
        lambda device: (fast, "stand-in CPU with bfloat16" if fast else "stand-in CPU without bfloat16"),
    )


def test_the_verdict_on_this_cpu_follows_its_declared_instructions() -> None:
    fast, why = precision.bfloat16_support("cpu")
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert fast == bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    assert why  # the reason is said in words, for the dry run and the log


@pytest.mark.parametrize("fast", [True, False])
def test_auto_becomes_bfloat16_only_where_it_runs_in_hardware(monkeypatch, fast: bool) -> None:
    _hardware(monkeypatch, fast)
    cfg = config_from_dict({"rollout": {"dtype": "auto"}, "trainer": {"autocast": "auto"}})
    assert cfg.engine_dtype == ("bfloat16" if fast else "float32")
    assert cfg.learner_autocast == ("bfloat16" if fast else "")
    plan, warnings = precision_notes(cfg)
    assert warnings == []
    assert any(
        line.startswith(
            f"precision: the rollout engine and the evaluations sample in {cfg.engine_dtype} "
            "(rollout.dtype=auto: stand-in"
        )
        for line in plan
    )
    assert any("trainer.autocast=auto" in line for line in plan)


def test_explicit_values_are_kept_as_written(monkeypatch) -> None:
    _hardware(monkeypatch, False)
    cfg = config_from_dict({"rollout": {"dtype": "float32"}, "trainer": {"autocast": ""}})
    assert (cfg.engine_dtype, cfg.learner_autocast) == ("float32", "")
    assert precision_notes(cfg) == ([], [])
    explicit = config_from_dict({"rollout": {"dtype": "bfloat16"}, "trainer": {"autocast": "bfloat16"}})
    assert (explicit.engine_dtype, explicit.learner_autocast) == ("bfloat16", "bfloat16")


def test_explicit_bfloat16_on_an_emulating_cpu_warns_in_the_dry_run_naming_the_keys(monkeypatch) -> None:
    _hardware(monkeypatch, False)
    cfg = load_config("math-tiny", ["rollout.dtype=bfloat16", "trainer.autocast=bfloat16"])
    report = dry_run_report(cfg)
    line = next(x for x in report.splitlines() if x.startswith("WARNING") and "bfloat16" in x)
    assert (
        "rollout.dtype=bfloat16, trainer.autocast=bfloat16 on cpu" in line and "stand-in CPU without" in line
    )
    assert "auto" in line  # the way out is named
    _hardware(monkeypatch, True)
    assert not any("bfloat16 on cpu" in x for x in dry_run_report(cfg).splitlines())


def test_the_run_logs_the_precision_before_any_work(monkeypatch, caplog) -> None:
    from trainer.preflight import warn_recipe

    _hardware(monkeypatch, False)
    caplog.set_level("INFO", logger="trainer.preflight")
    warn_recipe(load_config("math-smollm2", ["rollout.dtype=bfloat16"]))
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert any(lvl == "WARNING" and m.startswith("precision:") for lvl, m in messages)
    assert any(lvl == "INFO" and "trainer.autocast=auto, off" in m for lvl, m in messages)


def test_an_unknown_dtype_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="trainer.autocast"):
        load_config("math-tiny", ["trainer.autocast=float8"])
    with pytest.raises(ConfigError, match="rollout.dtype"):
        load_config("math-tiny", ["rollout.dtype=automatic"])


def test_the_benchmark_prints_each_dtype_the_ratio_and_the_verdict() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "precision.py"
    out = subprocess.run(
        [sys.executable, str(script), "--repeat", "1"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "GFLOP/s" in line]
    assert len(rows) == 2 and all("float32" in r and "bfloat16 / float32" in r for r in rows)
    fast = precision.bfloat16_support("cpu")[0]
    assert f"auto takes {'bfloat16' if fast else 'float32'}" in out.stdout and "load average" in out.stdout
    bad = subprocess.run(
        [sys.executable, str(script), "--threads", "0"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "--threads" in bad.stderr
