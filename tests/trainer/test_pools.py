"""Elastic pools: a CPU slot leaves the rollout pool mid-run with live episodes; none is dropped.

Real parts: the in-code tiny Qwen2, one HFEngine per CPU slot, a multi-turn gymnasium text env
with a tool-like delay between turns, the durable TrajectoryTree.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import gymnasium
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.policy.hf import HFEngine
from fr_agents.rollout import RolloutOptions, run_episodes
from fr_agents.spaces import AnyText
from fr_agents.tree import TrajectoryTree
from trainer.elastic.controller import (
    ControllerConfig,
    ElasticController,
    MigrationPolicy,
    Telemetry,
    TelemetryWindow,
    spare_fraction,
)
from trainer.elastic.pools import DeviceState, ElasticPool

torch.set_num_threads(1)
TURNS = 4


class ToolEnv(gymnasium.Env):
    """Multi-turn: every step 'calls a tool' that takes a few milliseconds, then asks again."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = AnyText(4096)
        self.action_space = AnyText(65536)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.t = 0
        return "Count to three.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        time.sleep(0.01)  # tool latency: the episode is live but not generating
        self.t += 1
        return f"tool said {self.t}", float(self.t == TURNS), self.t >= TURNS, False, {}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def _pool(model, tok, migration: MigrationPolicy | None = None, max_live: int = 8) -> ElasticPool:
    engines = {f"cpu{i}": HFEngine(copy.deepcopy(model), tok, max_batch_size=8, seed=i) for i in range(2)}
    return ElasticPool(engines, rollout=["cpu0", "cpu1"], max_live=max_live, migration=migration)


def _run_with_move(pool: ElasticPool, tok, tree: TrajectoryTree, n: int) -> list[Any]:
    opts = RolloutOptions(max_new_tokens=4, max_context=512, max_turns=TURNS + 1)

    async def main() -> list[Any]:
        async def mover() -> None:
            # wait until the slot has live episodes that have already played a turn
            while not (pool.live_counts()["cpu1"] >= 2 and tree.stats()["nodes"] > 3 * n):
                await asyncio.sleep(0.002)
            pool.move_to_train("cpu1")

        episodes = asyncio.ensure_future(
            run_episodes(lambda: ToolEnv(), pool, tok, tree, n, opts, concurrency=n, seeds=list(range(n)))
        )
        await mover()
        return await episodes

    return asyncio.run(main())


def test_slot_leaves_rollout_mid_run_without_dropping_episodes(tiny, tmp_path):
    model, tok = tiny
    pool = _pool(model, tok, MigrationPolicy(prefill_speedup=1e9))  # always migrate
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    n = 8
    results = _run_with_move(pool, tok, tree, n)
    assert len(results) == n
    for r in results:  # every episode played every turn and ended normally
        assert [leaf.status for leaf in r.leaves] == ["finished"]
        assert r.leaves[0].turns == TURNS
        assert r.leaves[0].reward == 1.0
    assert tree.open_paths() == []
    assert len(tree.leaf_ids()) == len({r.leaves[0].leaf_id for r in results})
    assert pool.devices["cpu1"].state is DeviceState.TRAIN and pool.devices["cpu1"].drained.is_set()
    assert pool.stats.migrated >= 2 and pool.stats.reprefill_tokens > 0
    assert pool.stats.finished == n == pool.stats.admitted
    # the moved episodes' stored paths are whole: prompt + one segment per turn, no gap
    for r in results:
        traj = tree.trajectory(r.leaves[0].leaf_id)
        assert sum(traj.policy_mask) == r.leaves[0].policy_tokens

    # the slot rejoins: it loads the current weights before admitting anything
    sd = {k: v + 0.01 for k, v in model.state_dict().items()}
    pool.set_weights(sd, 7)
    assert pool.devices["cpu1"].engine.version == 0  # train-pool devices get no weights
    pool.move_to_rollout("cpu1")
    assert pool.devices["cpu1"].engine.version == 7
    assert pool.devices["cpu1"].state is DeviceState.ROLLOUT
    asyncio.run(pool.close())
    tree.close()


def test_leaving_a_full_pool_moved_episodes_wait_for_a_slot(tiny, tmp_path):
    """cpu0 is full when cpu1 leaves: cpu1's episodes wait for free slots (ahead of new ones), then
    re-prefill there; every episode still plays every turn, none is dropped."""
    model, tok = tiny
    pool = _pool(model, tok, MigrationPolicy(prefill_speedup=1e9), max_live=3)
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    n = 8  # 6 slots for 8 episodes: a queue from the start, and cpu0 full when cpu1 drains
    results = _run_with_move(pool, tok, tree, n)
    assert len(results) == n
    assert all(r.leaves[0].turns == TURNS and r.leaves[0].status == "finished" for r in results)
    assert all(r.leaves[0].reward == 1.0 for r in results)
    assert pool.stats.migrated >= 2 and pool.stats.finished_in_place == 0
    assert pool.stats.finished == n == pool.stats.admitted
    assert pool.devices["cpu1"].state is DeviceState.TRAIN and not pool._resuming
    assert tree.open_paths() == []
    for r in results:
        traj = tree.trajectory(r.leaves[0].leaf_id)
        assert sum(traj.policy_mask) == r.leaves[0].policy_tokens
    asyncio.run(pool.close())
    tree.close()


def test_finish_in_place_when_migration_costs_more(tiny, tmp_path):
    model, tok = tiny
    pool = _pool(model, tok, MigrationPolicy(prefill_speedup=1e-9))  # re-prefill never pays
    tree = TrajectoryTree.open(tmp_path / "store.sqlite")
    results = _run_with_move(pool, tok, tree, 8)
    assert all(r.leaves[0].turns == TURNS and r.leaves[0].status == "finished" for r in results)
    assert pool.stats.migrated == 0 and pool.stats.finished_in_place >= 2
    assert pool.devices["cpu1"].state is DeviceState.TRAIN
    assert tree.open_paths() == []
    asyncio.run(pool.close())
    tree.close()


def _t(**kw: Any) -> Telemetry:
    base = dict(
        time_s=0.0,
        rollout_devices=4,
        train_devices=4,
        moving=0,
        queue_depth=0,
        unconsumed=0,
        batch_size=8,
        learner_idle_frac=0.0,
        long_tail_frac=0.0,
        staleness=0.5,
    )
    return Telemetry(**{**base, **kw})


def test_controller_rules():
    c = ElasticController(ControllerConfig(idle_high=0.2, tail_high=0.4, max_move_frac=0.5))
    assert c.decide(_t()) is None
    m = c.decide(_t(learner_idle_frac=0.5, queue_depth=10))
    assert m is not None and m.to == "rollout" and m.count == 2
    m = c.decide(_t(long_tail_frac=0.6, staleness=1.0, unconsumed=8))
    assert m is not None and m.to == "train" and m.count == 2
    # never below the minimum pool sizes, never during another move
    m = c.decide(_t(learner_idle_frac=1.0, queue_depth=10, train_devices=2))
    assert m is not None and m.count == 1
    assert c.decide(_t(learner_idle_frac=1.0, queue_depth=10, train_devices=1)) is None
    assert c.decide(_t(long_tail_frac=0.9, moving=1)) is None
    # one decision moves at most max_move_frac of a pool
    capped = ElasticController(ControllerConfig(max_move_frac=0.25)).decide(
        _t(learner_idle_frac=1.0, queue_depth=10)
    )
    assert capped is not None and capped.count == 1
    # a backlog of rollout work (queue > 0) is not a long tail
    assert c.decide(_t(long_tail_frac=0.9, queue_depth=3)) is None
    # a starved learner is not fed by moving devices when data is already waiting
    assert c.decide(_t(learner_idle_frac=0.9, queue_depth=3, unconsumed=8)) is None


def test_controller_cooldown_and_determinism():
    seq = [_t(time_s=float(i), learner_idle_frac=0.5, queue_depth=3) for i in range(6)]
    runs = []
    for _ in range(2):
        c = ElasticController(ControllerConfig(cooldown_s=2.5))
        runs.append([c.decide(t) for t in seq])
    assert runs[0] == runs[1]
    assert [m is not None for m in runs[0]] == [True, False, False, True, False, False]


def test_telemetry_window():
    w = TelemetryWindow(tau_s=1.0)
    for _ in range(50):
        w.observe(0.1, True, 0.8, 0)
    assert w.learner_idle > 0.95 and w.long_tail > 0.75
    for _ in range(50):
        w.observe(0.1, False, 0.8, 5)
    assert w.learner_idle < 0.05 and w.long_tail < 0.05
    # the finish rate: 3 episodes every 0.1 s -> 30/s once the average has settled
    r = TelemetryWindow(tau_s=1.0)
    for _ in range(100):
        r.observe(0.1, False, 0.0, 0, finished=3)
    assert r.finish_rate == pytest.approx(30.0, rel=0.06)
    r.reset()
    assert r.finish_rate > 25.0  # a move does not forget how fast episodes finish
    with pytest.raises(ValueError, match="tau_s"):
        TelemetryWindow(0)


def test_controller_leaves_a_latency_bound_rollout_alone():
    c = ElasticController(ControllerConfig(idle_high=0.2, tail_high=0.4))
    # the learner starves, but rollout devices sit idle with nothing queued: each episode waits on
    # its own tokens/tools, so more rollout devices would not produce trajectories any faster.
    # The spare devices are lent to training instead: the learner's next step runs on them.
    m = c.decide(_t(learner_idle_frac=0.9, queue_depth=0, long_tail_frac=0.7, staleness=0.5))
    assert m is not None and m.to == "train" and m.count == 2  # floor(0.7 * 4) spare devices
    # ... while a busy rollout pool (nothing spare) does get devices
    m = ElasticController(ControllerConfig(idle_high=0.2, tail_high=0.4)).decide(
        _t(learner_idle_frac=0.9, queue_depth=0, long_tail_frac=0.05, staleness=0.5)
    )
    assert m is not None and m.to == "rollout"


def test_controller_lends_to_a_learner_that_is_the_bottleneck():
    c = ElasticController(ControllerConfig(idle_high=0.2, tail_high=0.4, max_move_frac=0.5))
    # the learner is busy, rollout sits at the staleness bound with a backlog that would drain in
    # 10 / 1.0 = 10 s, but a step takes 60 s: the learner is the bottleneck, lend it devices
    busy = dict(learner_idle_frac=0.0, staleness=1.0, queue_depth=10, finish_rate=1.0, last_step_s=60.0)
    m = c.decide(_t(**busy))
    assert m is not None and m.to == "train" and m.count == 2
    # not while rollout may still admit (below the bound), nor when its backlog is the longer one
    assert ElasticController(c.config).decide(_t(**{**busy, "staleness": 0.5})) is None
    assert ElasticController(c.config).decide(_t(**{**busy, "last_step_s": 5.0})) is None


def test_controller_cost_estimates_use_backlog_and_step_time():
    cfg = ControllerConfig(idle_high=0.2, tail_high=0.4, max_move_frac=0.5, move_cost_s=10.0, hold_factor=2.0)
    # a backlog of 200 episodes at 1 episode/s: two more rollout devices save 200 * 2 / 6 = 67 s > 10 s
    m = ElasticController(cfg).decide(_t(learner_idle_frac=0.5, queue_depth=200, finish_rate=1.0))
    assert m is not None and m.to == "rollout"
    # ... a backlog of 20 at 1/s saves 6.7 s < 10 s: not worth a move
    assert ElasticController(cfg).decide(_t(learner_idle_frac=0.5, queue_depth=20, finish_rate=1.0)) is None
    # lending 2 spare devices to a 4-device learner whose steps take 90 s saves 30 s > 2 * 10 s ...
    tail = dict(long_tail_frac=0.6, queue_depth=0)
    m = ElasticController(cfg).decide(_t(last_step_s=90.0, **tail))
    assert m is not None and m.to == "train"
    # ... with 45 s steps it saves 15 s < 20 s (there and back): no
    assert ElasticController(cfg).decide(_t(last_step_s=45.0, **tail)) is None


def test_spare_fraction():
    # 4 devices of 8 slots: 6 live episodes would fit on one device -> 3 of 4 spare
    assert spare_fraction(4, live=6, slots=8, generating=2, saturation=8) == pytest.approx(0.75)
    # compute binds first: 24 generations need 3 devices at 8 each
    assert spare_fraction(4, live=24, slots=64, generating=24, saturation=8) == pytest.approx(0.25)
    # the KV cache binds: 2.5M tokens held on 1M-token devices need 3 of them
    assert spare_fraction(
        4, live=4, slots=64, generating=0, saturation=8, kv_used=2.5e6, kv_tokens=1e6
    ) == pytest.approx(0.25)
    # a full pool has nothing spare; no devices, nothing spare
    assert spare_fraction(2, live=16, slots=8, generating=16, saturation=8) == 0.0
    assert spare_fraction(0, live=0, slots=8, generating=0, saturation=8) == 0.0


def test_controller_is_cost_aware_with_hysteresis():
    cfg = ControllerConfig(idle_high=0.2, tail_high=0.4, max_move_frac=0.5, move_cost_s=10.0, hold_factor=4.0)
    assert cfg.hold_s == 40.0
    c = ElasticController(cfg)
    # gain over the 40 s horizon: 40 * 0.5 * 2 / (4 + 2) = 6.7 s < 10 s cost -> no move
    assert c.decide(_t(learner_idle_frac=0.5, queue_depth=10)) is None
    # a heavily starved learner: 40 * 1.0 * 2 / 6 = 13.3 s > 10 s -> move
    m = c.decide(_t(learner_idle_frac=1.0, queue_depth=10))
    assert m is not None and m.to == "rollout"
    # hysteresis: nothing, not even the opposite move, until the hold has passed
    tail = dict(long_tail_frac=0.9, staleness=1.0, unconsumed=8, rollout_devices=8, train_devices=2)
    assert c.decide(_t(time_s=39.0, **tail)) is None
    m = c.decide(_t(time_s=41.0, **tail))
    assert m is not None and m.to == "train"
    with pytest.raises(ValueError, match="move_cost_s"):
        ControllerConfig(move_cost_s=-1.0)
    with pytest.raises(ValueError, match="hold_factor"):
        ControllerConfig(hold_factor=0.5)


def test_controller_brings_lent_devices_home_when_rollout_fills_again():
    c = ElasticController(ControllerConfig(idle_high=0.2, tail_high=0.4, max_move_frac=0.5))
    m = c.decide(_t(long_tail_frac=0.6, rollout_devices=4, train_devices=4))  # the tail: lend 2
    assert m is not None and m.to == "train" and m.count == 2 and c.home_rollout == 4
    # later: the learner is busy, a new batch fills the smaller rollout pool -> the 2 come back
    m = c.decide(_t(time_s=10.0, rollout_devices=2, train_devices=6, queue_depth=5, long_tail_frac=0.0))
    assert m is not None and m.to == "rollout" and m.count == 2
    # at the starting split nothing more moves for that reason
    assert (
        c.decide(_t(time_s=20.0, rollout_devices=4, train_devices=4, queue_depth=5, long_tail_frac=0.0))
        is None
    )


def test_spare_share_falls_at_once_and_rises_slowly():
    w = TelemetryWindow(tau_s=10.0)
    for _ in range(200):
        w.observe(1.0, False, 0.9, 0)
    assert w.long_tail > 0.85
    w.observe(0.01, False, 0.1, 0)  # a batch was admitted: the pool is full now
    assert w.long_tail == pytest.approx(0.1)
    w.observe(1.0, False, 0.9, 0)
    assert 0.1 < w.long_tail < 0.3  # one spare second does not make the pool spare again
