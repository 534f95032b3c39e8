"""ElasticHooks: the embedded loop on elastic CPU-slot pools, and the trainer.elastic switch.

Real parts: math-tiny with the in-code nano model, one HFEngine per slot, the ledger and the tree.
The controller is scripted (one move each way at fixed times) so the moves happen in every run;
the pools, the drain and the weight loads are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fr_agents.config import ConfigError, load_config
from fr_agents.ledger import EpisodeLedger
from fr_agents.tree import TrajectoryTree
from trainer.elastic import ElasticHooks
from trainer.elastic.controller import Move, Telemetry
from trainer.loop import Trainer

BASE = [
    "trainer.backend=local",  # the elastic runtime's hooks act inside the rollout
    "model.tiny_size=nano",
    "tasks.params={digits: 1}",
    "env.kwargs={answer_format: plain, format_reward: 0.1}",
    "trainer.batch_size=8",
    "rollout.concurrency=8",
    "rollout.max_policy_lag=1",
    "trainer.checkpoint_every=0",
    "trainer.max_minutes=0",
    "trainer.eval_episodes=0",
    "trainer.plot_every=100",
    "trainer.collapse_guard=false",
    "warm_start.examples=0",
    "trainer.threads=1",
]


class Scripted:
    """A controller that lends a rollout slot to training after the first step, then takes it back."""

    def __init__(self, trainer: ElasticHooks) -> None:
        self.trainer = trainer
        self.done: list[str] = []

    def decide(self, t: Telemetry) -> Move | None:
        if t.moving:
            return None
        steps = len(self.trainer.step_seconds)
        if not self.done and steps >= 1:
            self.done.append("train")
            return Move("train", 1, "scripted")
        if self.done == ["train"] and steps >= 2 and t.train_devices >= 2:
            self.done.append("rollout")
            return Move("rollout", 1, "scripted")
        return None


def test_elastic_trainer_moves_slots_mid_run_and_consumes_every_episode(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    steps = 5
    cfg = load_config("math-tiny", [*BASE, f"trainer.steps={steps}"])
    tr = ElasticHooks(cfg, devices=3, rollout=2, tick_s=0.02)
    script = Scripted(tr)
    tr.controller = script  # type: ignore[assignment]
    res = Trainer(cfg, tmp_path, console=False, hooks=[tr]).run()
    assert res.ok and res.steps == steps
    assert script.done == ["train", "rollout"]
    st = tr.pool.stats
    assert st.moves_to_train == 1 and st.moves_to_rollout == 1
    # no episode dropped: every admitted episode finished, every batch is whole and consumed
    assert st.admitted == st.finished == steps * cfg.trainer.batch_size
    ledger, tree = EpisodeLedger(tmp_path / "episodes.sqlite"), TrajectoryTree.open(tmp_path / "store.sqlite")
    assert [len(ledger.batch_rows(k)) for k in range(steps)] == [cfg.trainer.batch_size] * steps
    assert tree.stats()["available"] == 0 and tree.open_paths() == []
    ledger.close()
    tree.close()
    # the pools changed during the run and never emptied; a step's slot count is what it trained on
    splits = {(r, k) for _, r, k in tr.pool_trace}
    assert (2, 1) in splits and any(k == 2 for _, k in splits)
    assert all(r >= 1 and k >= 1 for r, k in splits if r + k == 3)
    assert {n for n, _ in tr.step_seconds} <= {1, 2} and len(tr.step_seconds) == steps
    # CPU accounting for the simulator's calibration
    cpu = tr.cpu_seconds
    assert cpu["episodes"] == steps * cfg.trainer.batch_size
    assert cpu["process"] >= cpu["learner"] > 0 and cpu["engines"] > 0


def test_elastic_switch_is_validated() -> None:
    cfg = load_config(
        "math-tiny",
        ["trainer.elastic=true", "trainer.backend=local", "trainer.devices=4", "trainer.rollout_devices=3"],
    )
    assert cfg.trainer.elastic and cfg.trainer.devices == 4
    with pytest.raises(ConfigError, match="trainer.elastic"):
        load_config("math-tiny", ["trainer.elastic=true", "trainer.backend=ray"])
    with pytest.raises(ConfigError, match="trainer.elastic: .*trainer.backend=local.*'process'"):
        load_config("math-tiny", ["trainer.elastic=true"])  # the default backend runs the rollout in a child
    with pytest.raises(ConfigError, match="trainer.elastic"):
        load_config("math-tiny", ["trainer.elastic=true", "trainer.backend=local", "rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="trainer.devices"):
        load_config("math-tiny", ["trainer.elastic=true", "trainer.backend=local", "trainer.devices=1"])
    with pytest.raises(ConfigError, match="trainer.rollout_devices"):
        load_config(
            "math-tiny",
            [
                "trainer.elastic=true",
                "trainer.backend=local",
                "trainer.devices=3",
                "trainer.rollout_devices=3",
            ],
        )


def test_a_step_grows_onto_a_slot_lent_while_it_runs(tmp_path: Path) -> None:
    """A slot that joins the train pool during a step is used from the step's next micro-batch on."""
    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=3", "trainer.micro_batch_tokens=64"])
    tr = ElasticHooks(cfg, devices=3, rollout=2, elastic=False, tick_s=0.02)
    grow = tr._grow_step
    calls: list[int] = []
    lent: list[bool] = []

    def hook() -> None:
        calls.append(len(tr.step_seconds))
        if len(tr.step_seconds) == 1 and not lent:  # the second step's first micro-batch
            lent.append(tr.pool.move_to_train("cpu1").wait(timeout=120))  # drains: its episodes move on
        grow()

    tr._grow_step = hook  # type: ignore[method-assign]
    res = Trainer(cfg, tmp_path, console=False, hooks=[tr]).run()
    assert res.ok and res.steps == 3 and lent == [True]
    assert calls.count(1) > 1  # the step had more micro-batches after the lend
    assert tr.grown_steps == 1
    assert [n for n, _ in tr.step_seconds] == [1, 1, 2]  # step 2 began on 1 slot, step 3 on 2
    st = tr.pool.stats
    assert st.admitted == st.finished == 3 * cfg.trainer.batch_size


def test_slot_engines_get_the_configured_batch_size_and_distinct_seeds() -> None:
    """Each slot engine the elastic hooks add copies the base engine's batch size and takes its own
    seed (trainer.seed + slot), so the slots do not sample the same streams."""
    from fr_agents.models.resolve import load_policy
    from fr_agents.policy.hf import HFEngine

    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.seed=5"])
    model, tok = load_policy("tiny")
    base = HFEngine(model, tok, max_batch_size=7, seed=cfg.trainer.seed)
    pool = ElasticHooks(cfg, devices=3, rollout=2).engine(base, tok)
    engines = {name: dev.engine for name, dev in pool.devices.items()}
    assert set(engines) == {"cpu0", "cpu1", "cpu2"}
    assert [engines[d].max_batch_size for d in ("cpu0", "cpu1", "cpu2")] == [7, 7, 7]
    seeds = [engines[d]._gen.initial_seed() for d in ("cpu0", "cpu1", "cpu2")]
    assert seeds == [5, 6, 7]
