"""benchmarks/gpu_check.py, the GPU path's check, runs here on the CPU so that it cannot rot while no
device is at hand: a real run of a few steps prints its figures, and the settings its CUDA path
chooses are ones the config accepts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fr_agents.config import load_config
from tests.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _script() -> ModuleType:
    return load_benchmark("gpu_check")


def test_a_cpu_run_prints_positive_figures(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--steps",
            "2",
            "--warm-start",
            "4",
            "--eval-episodes",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            "model.tiny_size=nano",
            "trainer.batch_size=8",
            "rollout.concurrency=8",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["device"].startswith("cpu") and out["torch"] == torch.__version__
    assert out["steps_done"] == out["steps_asked"] == 2 and out["exit_code"] == 0
    for key in (
        "step_time_median_s",
        "policy_tokens_per_s",
        "policy_tokens_per_s_median",
        "sampled_tokens_per_s",
        "policy_tokens_per_step",
        "peak_rss_mib",
        "wall_s",
    ):
        assert out[key] > 0, key
    assert {"held_out_before", "held_out_after_warm_start", "held_out_after_rl"} <= set(out)
    text = "\n".join(lines[:-1])
    for start in (
        "device: cpu",
        "torch ",
        "steps done: 2 of 2",
        "step time: median ",
        "policy tokens/s: ",
        "peak memory (CPU run): ",
    ):
        assert any(line.startswith(start) for line in lines[:-1]), (start, text[-2000:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_cuda_without_a_device_says_to_pass_device_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--device cuda: no CUDA device is visible" in proc.stderr and "pass --device cpu" in proc.stderr


@pytest.mark.parametrize("preset", ["math-tiny", "python-tool-tiny", "env-tiny"])
@pytest.mark.parametrize("engine", ["auto", "hf", "vllm"])
def test_the_cuda_settings_are_valid_config(
    preset: str, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the script asks of a CUDA run (bfloat16 where supported, the engine, a short warm start)
    passes the config's validation, so a device run fails on the device, not on the config."""
    gpu_check = _script()
    for bf16 in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        a = gpu_check.parse_args(["--device", "cuda", "--engine", engine, "--preset", preset])
        overrides = gpu_check.overrides_for(a)
        cfg = load_config(preset, overrides)
        assert cfg.trainer.device == "cuda" and cfg.model.dtype == ("bfloat16" if bf16 else "float32")
        assert cfg.rollout.engine == gpu_check.pick_engine(engine, "cuda")
        assert cfg.trainer.steps == 5 and cfg.trainer.max_minutes == 0 and cfg.trainer.plateau_patience == 0
        assert cfg.warm_start.examples == (0 if cfg.tasks.source == "env-reset" else 32)
    cpu = load_config(
        preset, gpu_check.overrides_for(gpu_check.parse_args(["--device", "cpu", "--preset", preset]))
    )
    assert (
        cpu.model.dtype == load_config(preset).model.dtype and cpu.rollout.engine == "hf"
    )  # auto on the CPU


def test_auto_engine_is_vllm_only_on_cuda_where_it_is_installed() -> None:
    gpu_check = _script()
    assert gpu_check.pick_engine("auto", "cpu") == "hf"
    installed = importlib.util.find_spec("vllm") is not None
    assert gpu_check.pick_engine("auto", "cuda") == ("vllm" if installed else "hf")
    assert gpu_check.pick_engine("hf", "cuda") == "hf" and gpu_check.pick_engine("vllm", "cpu") == "vllm"
