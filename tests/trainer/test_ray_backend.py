"""``trainer.backend=ray``: a few steps of math-tiny on a local Ray (2 CPUs: learner + 1 worker)."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from fr_agents.config import load_config  # noqa: E402
from fr_agents.ledger import EpisodeLedger  # noqa: E402
from fr_agents.tree import TrajectoryTree  # noqa: E402
from trainer.ray_backend import run_training_ray  # noqa: E402

OVERRIDES = [
    "trainer.backend=ray",
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "rollout.max_policy_lag=1",
    "trainer.steps=3",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "warm_start.examples=0",
    "trainer.collapse_guard=false",
]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_trains_math_tiny(tmp_path):
    cfg = load_config("math-tiny", OVERRIDES)
    res = run_training_ray(cfg, tmp_path / "run", num_cpus=2)
    assert res.ok and res.steps == 3 and res.last_checkpoint is not None
    assert not ray.is_initialized()  # the local Ray it started is shut down
    ledger = EpisodeLedger(tmp_path / "run" / "episodes.sqlite")
    for k in range(3):  # every scheduled episode of every batch was run and recorded
        rows = ledger.batch_rows(k)
        assert len(rows) == 8
        assert all(v == max(0, k - 1) for *_, v in rows)  # sampled with version k - lag
    ledger.close()
    tree = TrajectoryTree.open(tmp_path / "run" / "store.sqlite")
    assert tree.open_paths() == []
    tree.close()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s and "reward" in s][-1] == 3


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_ray_trains_with_vllm_rollout_workers(tmp_path):
    """rollout.engine=vllm on Ray: the worker samples with a VLLMEngine, the learner holds none."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    over = [o for o in OVERRIDES if not o.startswith(("model.tiny_size", "trainer.steps"))]
    cfg = load_config("math-tiny", [*over, "rollout.engine=vllm", "trainer.steps=2"])
    res = run_training_ray(cfg, tmp_path / "run", num_cpus=2)
    assert res.ok and res.steps == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["engine"] for r in rows if r["kind"] == "start"] == ["vllm (rollout workers)"]
    ledger = EpisodeLedger(tmp_path / "run" / "episodes.sqlite")
    assert [len(ledger.batch_rows(k)) for k in range(2)] == [8, 8]
    ledger.close()
