"""Periodic avg@k during training: the hook the training loop calls every trainer.eval_every steps."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from envs.benches import eval_bench_for
from fr_agents.config import load_config
from fr_agents.eval.periodic import PeriodicEval
from fr_agents.models import load_policy

torch.set_num_threads(1)


def test_periodic_eval_runs_avg_at_k_on_the_configured_bench(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    cfg = load_config("math-tiny", ["trainer.eval_k=2", "trainer.eval_every=5", "trainer.eval_episodes=16"])
    periodic = PeriodicEval.from_config(cfg, tmp_path, eval_bench_for(cfg))
    assert periodic is not None and len(periodic.bench.items) == 16
    assert [s for s in range(0, 16) if periodic.due(s)] == [5, 10, 15]
    model, tok = load_policy(str(checkpoints["after"]))
    model.train()
    row = periodic.run(5, model, tok)
    assert model.training  # the learner's mode is restored
    assert row["step"] == 5 and row["k"] == 2 and row["tasks"] == 16 and row["avg@2"] >= 0.8
    assert {"pass@1", "pass@2", "success"} <= set(row)
    logged = [
        json.loads(line) for line in (tmp_path / "evals" / "during_training.jsonl").read_text().splitlines()
    ]
    assert logged == [row]
    assert (tmp_path / "evals" / "samples" / "step_000005" / "preset_math-tiny.jsonl").exists()


def test_periodic_eval_is_off_unless_eval_k_and_eval_every_are_set(tmp_path: Path) -> None:
    cfg = load_config("math-tiny")
    assert cfg.trainer.eval_k == 0
    assert PeriodicEval.from_config(cfg, tmp_path, eval_bench_for(cfg)) is None
    cfg = load_config("math-tiny", ["trainer.eval_k=4", "trainer.eval_every=0"])
    assert PeriodicEval.from_config(cfg, tmp_path, eval_bench_for(cfg)) is None
