"""A Ray rollout worker builds the rollout side only: one policy copy, no optimizer, the resources
its engine needs; the package reaches workers the way Ray expects."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from fr_agents.config import load_config
from trainer.ray_backend import PACKAGES, RolloutCore, rollout_worker_resources, runtime_env

SMALL = [
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "trainer.batch_size=4",
    "rollout.concurrency=4",
    "trainer.threads=1",
    "warm_start.examples=0",
    "trainer.eval_episodes=0",
]


def _new(kind: type, before: set[int]) -> list:
    return [o for o in gc.get_objects() if isinstance(o, kind) and id(o) not in before]


def test_rollout_worker_holds_one_policy_copy_and_no_optimizer(tmp_path: Path) -> None:
    from transformers import PreTrainedModel

    torch.set_num_threads(1)
    cfg = load_config("math-tiny", SMALL)
    gc.collect()
    models = {id(o) for o in gc.get_objects() if isinstance(o, PreTrainedModel)}
    optims = {id(o) for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)}
    core = RolloutCore(cfg, str(tmp_path))
    try:
        gc.collect()
        new = _new(PreTrainedModel, models)
        # whole models only (a causal LM holds its base model, itself a PreTrainedModel)
        whole = [m for m in new if not any(m is sub for o in new if o is not m for sub in o.modules())]
        assert len(whole) == 1, "one policy copy, inside the engine"
        assert whole[0] is core.side.runner.engine.model
        assert _new(torch.optim.Optimizer, optims) == []
        # and it works: batch 0 with the engine's own weights as version 0
        weights = {k: v.detach().clone() for k, v in core.side.runner.engine.model.state_dict().items()}
        eps = [s.episode for s in core.side.schedule.episodes(0)]
        out = core.run(eps, 0, weights, 0)
        assert sorted(e for e, _, _ in out) == eps
        assert [r[0] for r in core.side.ledger.batch_rows(0)] == eps
    finally:
        core.side.close()


def test_rollout_worker_asks_for_what_its_engine_needs() -> None:
    cpu = load_config("math-tiny")
    assert rollout_worker_resources(cpu) == {"num_cpus": 1, "num_gpus": 0}
    gpu = load_config("math-tiny", ["trainer.device=cuda"])
    assert rollout_worker_resources(gpu) == {"num_cpus": 1, "num_gpus": 1}


def test_package_is_shipped_only_when_workers_cannot_import_it() -> None:
    for install, remote in (("regular", False), ("regular", True), ("editable", False)):
        env = runtime_env(remote=remote, install=install)
        assert "py_modules" not in env and "PYTHONPATH" not in env["env_vars"], (install, remote)
    for install, remote in (("none", False), ("none", True), ("editable", True)):
        env = runtime_env(remote=remote, install=install)
        assert [Path(p).name for p in env["py_modules"]] == list(PACKAGES), (install, remote)
        assert all((Path(p) / "__init__.py").exists() for p in env["py_modules"])
