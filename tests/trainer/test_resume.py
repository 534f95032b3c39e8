"""Exact resume: SIGKILL mid-run, ``fr-agents train --resume`` gives the same batches and parameters.

Two runs of the same small config: A uninterrupted, B killed with SIGKILL after its step-2
checkpoint (while later steps and rollouts are in flight) and resumed. Every batch the learner
consumed must hold the same episodes with the same sampled tokens and rewards in both runs, and the
final parameters must agree.

Precision: the runs compute in float64. In float32 the engine's batching decides the result: it
batches whatever requests are pending, a matmul over a different number of rows rounds the last bit
differently, and Adam's normalised update turns that ~1e-7 noise in near-zero gradients into
parameter differences of a few 1e-6, as large between two *uninterrupted* float32 runs of this config
(2.8e-6 measured) as between an uninterrupted and a resumed one. In float64 two uninterrupted runs
end bit-identical, so a resume must match to 1e-12: any real resume error (a batch replayed or
skipped, a lost optimizer moment, a different sampler seed) is far above that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file

from fr_agents.ledger import EpisodeLedger
from fr_agents.tree import TrajectoryTree
from trainer.checkpoint import latest_checkpoint

OVERRIDES = [
    "model.tiny_size=nano",
    "model.dtype=float64",  # see the module docstring: float32 batching noise exceeds any tight bound
    "tasks.params={digits: 1, ops: ['+']}",
    "env.kwargs={answer_format: plain, format_reward: 0.1}",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "rollout.max_policy_lag=1",
    "trainer.steps=6",
    "trainer.checkpoint_every=2",
    "trainer.keep_checkpoints=10",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "trainer.plot_every=100",
    "trainer.collapse_guard=false",
    "warm_start.examples=64",
    # enough that some answers are right in batches after the kill too (the rewards must vary there, or
    # the resumed steps would have zero gradient and only Adam's momentum would be compared)
    "warm_start.epochs=30",
    "warm_start.lr=1e-2",
    "optim.lr=3e-3",
]


def _train(args: list[str], **popen: Any) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FR_AGENTS_LOG": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "fr_agents.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def _steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [
        json.loads(line).get("step", 0) for line in path.read_text().splitlines() if '"kind": "step"' in line
    ]
    return max(steps, default=0)


def _batches(run: Path, steps: int) -> list[list[tuple[int, list[int], list[float], float]]]:
    ledger = EpisodeLedger(run / "episodes.sqlite")
    tree = TrajectoryTree.open(run / "store.sqlite")
    out = []
    for k in range(steps):
        rows = ledger.batch_rows(k)
        trajs = tree.trajectories([r[1] for r in rows])
        out.append([(r[0], t.token_ids, t.logprobs, t.reward) for r, t in zip(rows, trajs, strict=True)])
    ledger.close()
    tree.close()
    return out


def resume_point(run: Path) -> int:
    """The step of ``run``'s newest complete checkpoint: where ``--resume`` picks it up."""
    ckpt = latest_checkpoint(run)
    assert ckpt is not None, f"{run} has no complete checkpoint"
    return int(ckpt.name.removeprefix("step_"))


def assert_resumed_run_matches(a: Path, b: Path, resumed_from: int, steps: int = 6) -> None:
    """Run ``b`` (killed, then resumed from its step-``resumed_from`` checkpoint) consumed the same
    batches as run ``a`` and ends with the same parameters; its metrics hold each step once."""
    batches_a, batches_b = _batches(a, steps), _batches(b, steps)
    for k, (ba, bb) in enumerate(zip(batches_a, batches_b, strict=True)):
        assert [x[0] for x in ba] == [x[0] for x in bb], f"batch {k}: different episodes"
        for (ep, toks_a, lp_a, r_a), (_, toks_b, lp_b, r_b) in zip(ba, bb, strict=True):
            assert toks_a == toks_b, f"batch {k} episode {ep}: different tokens"
            assert r_a == r_b
            assert torch.allclose(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-12, rtol=0)
    resumed = batches_a[resumed_from:]  # the batches of the steps the resumed run took again
    assert any(len({x[3] for x in batch}) > 1 for batch in resumed), (
        f"the test needs a learning signal after the step-{resumed_from} checkpoint (rewards "
        "must vary within a resumed batch, or the resumed steps have zero gradient)"
    )

    final_a = load_file(a / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    final_b = load_file(b / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    start = load_file(a / "checkpoints" / "step_000000" / "model.safetensors")
    moved = max(float((final_a[k] - start[k]).abs().max()) for k in final_a)
    assert moved > 1e-4, "parameters did not move: the comparison would be vacuous"
    diff = max(float((final_a[k] - final_b[k]).abs().max()) for k in final_a)
    assert diff <= 1e-12, f"resumed parameters differ by {diff}"

    metrics = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    logged = [m["step"] for m in metrics if m["kind"] == "step"]
    assert logged == list(range(1, steps + 1)), "metrics.jsonl must hold each step once after a resume"


@pytest.mark.timeout(600)
def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pa = _train(["math-tiny", *OVERRIDES, "--run-dir", str(a)])
    out_a, _ = pa.communicate(timeout=400)
    assert pa.returncode == 0, out_a

    pb = _train(["math-tiny", *OVERRIDES, "--run-dir", str(b)])
    deadline = time.monotonic() + 400
    while _steps_logged(b) < 3 and time.monotonic() < deadline and pb.poll() is None:
        time.sleep(0.05)
    assert pb.poll() is None, "run B ended before it could be killed mid-run"
    assert (b / "checkpoints" / "step_000002").exists()
    children = psutil.Process(pb.pid).children()  # the rollout process (trainer.backend=process) among them
    assert children, "the run has a rollout process"
    pb.send_signal(signal.SIGKILL)
    pb.communicate(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"processes outlived the killed run: {[p.cmdline() for p in alive]}"
    killed_at = _steps_logged(b)
    assert 3 <= killed_at < 6
    resumed_from = resume_point(b)

    pr = _train(["--resume", str(b)])
    out_r, _ = pr.communicate(timeout=400)
    assert pr.returncode == 0, out_r

    assert_resumed_run_matches(a, b, resumed_from)


@pytest.mark.timeout(600)
def test_resume_with_a_new_learning_rate_trains_at_that_rate(tmp_path: Path) -> None:
    """``fr-agents train --resume RUN optim.lr=X``: the steps after the checkpoint run at X. The optimizer's
    saved state carries the old rate in its parameter groups; restoring it must not override the config."""
    run = tmp_path / "run"
    short = [
        *(o for o in OVERRIDES if not o.startswith(("trainer.steps", "warm_start.epochs"))),
        "trainer.steps=2",
        "warm_start.epochs=2",
    ]
    pa = _train(["math-tiny", *short, "--run-dir", str(run)])
    out, _ = pa.communicate(timeout=400)
    assert pa.returncode == 0, out
    assert resume_point(run) == 2

    pr = _train(["--resume", str(run), "trainer.steps=4", "optim.lr=7e-4"])
    out, _ = pr.communicate(timeout=400)
    assert pr.returncode == 0, out

    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = {m["step"]: m["lr"] for m in metrics if m["kind"] == "step"}
    assert lrs[1] == lrs[2] == pytest.approx(3e-3)
    assert lrs[3] == lrs[4] == pytest.approx(7e-4)
