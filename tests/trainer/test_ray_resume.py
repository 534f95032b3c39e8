"""Exact resume on the Ray backend: the whole local Ray killed mid-run, ``--resume`` continues it.

Two Ray runs of the same small config (learner + one rollout worker on a local Ray): A
uninterrupted, B's driver started in its own process group and that whole group -- driver,
raylet, GCS, the learner and worker actors -- SIGKILLed after its step-2 checkpoint while later
steps and rollouts are in flight. ``fr-agents train --resume B`` then finishes B on a fresh local
Ray. Every batch must hold the same episodes, tokens and rewards in both runs, the final
parameters must agree, each step is logged once, and the episodes B's ledger acknowledged before
the kill are kept, not run again. Tolerances as in ``test_resume.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("ray")

from tests.trainer.test_resume import OVERRIDES, _batches, _steps_logged  # noqa: E402
from trainer.ledger import EpisodeLedger  # noqa: E402

RAY = [*OVERRIDES, "trainer.backend=ray"]


def _train(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FR_AGENTS_LOG": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "fr_agents.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the local Ray it starts lives in it too
    )


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _acknowledged(run: Path, steps: int) -> dict[int, int]:
    ledger = EpisodeLedger(run / "episodes.sqlite")
    out = {r[0]: r[1] for k in range(steps) for r in ledger.batch_rows(k)}
    ledger.close()
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_run_killed_then_resumed_matches_uninterrupted(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pa = _train(["math-tiny", *RAY, "--run-dir", str(a)])
    try:
        out_a, _ = pa.communicate(timeout=400)
    finally:
        _kill_group(pa)  # a local Ray never outlives its test
    assert pa.returncode == 0, out_a

    pb = _train(["math-tiny", *RAY, "--run-dir", str(b)])
    try:
        deadline = time.monotonic() + 400
        while _steps_logged(b) < 3 and time.monotonic() < deadline and pb.poll() is None:
            time.sleep(0.05)
        assert pb.poll() is None, "run B ended before it could be killed mid-run"
        assert (b / "checkpoints" / "step_000002").exists()
    finally:
        _kill_group(pb)
    pb.communicate(timeout=60)
    killed_at = _steps_logged(b)
    assert 3 <= killed_at < 6
    before = _acknowledged(b, 6)  # episode -> leaf, as B's ledger held them at the kill

    pr = _train(["--resume", str(b)])
    try:
        out_r, _ = pr.communicate(timeout=400)
    finally:
        _kill_group(pr)
    assert pr.returncode == 0, out_r

    after = _acknowledged(b, 6)
    assert len(before) > 2 * 8, "the kill came before any batch beyond the checkpoint was acknowledged"
    assert all(after[ep] == leaf for ep, leaf in before.items()), "an acknowledged episode was run again"

    batches_a, batches_b = _batches(a, 6), _batches(b, 6)
    for k, (ba, bb) in enumerate(zip(batches_a, batches_b, strict=True)):
        assert [x[0] for x in ba] == [x[0] for x in bb], f"batch {k}: different episodes"
        for (ep, toks_a, lp_a, r_a), (_, toks_b, lp_b, r_b) in zip(ba, bb, strict=True):
            assert toks_a == toks_b, f"batch {k} episode {ep}: different tokens"
            assert r_a == r_b
            assert torch.allclose(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5)
    assert len({x[3] for batch in batches_a for x in batch}) > 1, "the test needs a learning signal"

    final_a = load_file(a / "checkpoints" / "step_000006" / "model.safetensors")
    final_b = load_file(b / "checkpoints" / "step_000006" / "model.safetensors")
    start = load_file(a / "checkpoints" / "step_000000" / "model.safetensors")
    assert max(float((final_a[k] - start[k]).abs().max()) for k in final_a) > 1e-4, "parameters did not move"
    diff = max(float((final_a[k] - final_b[k]).abs().max()) for k in final_a)
    assert diff <= 1e-6, f"resumed parameters differ by {diff}"

    metrics = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["kind"] == "step"] == list(range(1, 7))
