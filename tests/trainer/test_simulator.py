"""The elastic cluster simulator: determinism, the CLI's JSON keys, and policy sanity."""

from __future__ import annotations

import json

import pytest

from fr_agents.cli import main as cli_main
from fr_agents.config import ConfigError
from trainer.elastic.simulator import WORKLOADS, compare, get_workload, make_episodes, simulate

SMALL = get_workload("tool").with_overrides(steps=4, batch_size=32)


def test_deterministic():
    a = simulate(SMALL, 4, "elastic", rollout_devices=2, seed=3)
    b = simulate(SMALL, 4, "elastic", rollout_devices=2, seed=3)
    assert a == b
    c = simulate(SMALL, 4, "elastic", rollout_devices=2, seed=4)
    assert c.makespan_s != a.makespan_s


def test_common_random_numbers_every_policy_simulates_the_same_episodes():
    """One seed, one set of episodes: every policy generates the same turns and tokens (only
    their timing differs); another seed draws other episodes."""
    runs = [
        simulate(SMALL, 4, "colocated", seed=3),
        simulate(SMALL, 4, "colocated_async", seed=3),
        simulate(SMALL, 4, "static", rollout_devices=2, seed=3),
        simulate(SMALL, 4, "elastic", rollout_devices=2, seed=3),
    ]
    episodes = [e for k in range(SMALL.steps) for e in make_episodes(SMALL, k, 3)]
    turns = sum(len(e.turns) for e in episodes)
    tokens = sum(t for e in episodes for t, _ in e.turns) + (turns - len(episodes)) * SMALL.obs_tokens
    assert {(r.turns, r.tokens) for r in runs} == {(turns, tokens)}
    assert len({r.makespan_s for r in runs}) > 1  # the policies really differ in timing
    other = simulate(SMALL, 4, "elastic", rollout_devices=2, seed=4)
    assert (other.turns, other.tokens) != (turns, tokens)


def test_cli_json_keys(capsys):
    rc = cli_main(["simulate-elastic", "--workload", "tool", "--gpus", "4", "--steps", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "speedup_vs_colocated",
        "speedup_vs_static_async",
        "throughput",
        "best_static_rollout_devices",
    ):
        assert key in out
    tp = out["throughput"]
    assert out["speedup_vs_colocated"] == pytest.approx(tp["elastic"] / tp["colocated"])
    assert out["speedup_vs_static_async"] == pytest.approx(tp["elastic"] / tp["static_async"])


def test_cli_rejects_bad_input(capsys):
    assert cli_main(["simulate-elastic", "--workload", "nope", "--gpus", "4"]) != 0
    assert "--workload" in capsys.readouterr().err
    assert cli_main(["simulate-elastic", "--workload", "tool", "--gpus", "1"]) != 0
    assert "--gpus" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--steps"):
        from trainer.elastic.simulator import main_simulate

        main_simulate("tool", 4, steps=0)


def test_policy_sanity(tmp_path):
    res = compare(SMALL, 4)
    tp = res["throughput"]
    # the best static split is the best of the splits it tried
    assert tp["static_async"] == pytest.approx(max(res["static_grid"].values()))
    # overlapping rollout with training beats lock-step on a long-tailed multi-turn workload
    assert tp["static_async"] > tp["colocated"]
    # every scheduled trajectory was consumed, pools never dropped below one device
    assert res["elastic"]["trajectories"] == SMALL.steps * SMALL.batch_size
    assert all(r >= 1 and k >= 1 for _, r, k in res["pool_trace"])
    # rollout-bound (cheap training, compute-saturated decode): more rollout devices are faster;
    # train-bound: more train devices are faster
    roll = SMALL.with_overrides(train_tokens_per_s=1e9, train_fixed_s=0.1, decode_per_seq_s=0.01)
    assert (
        simulate(roll, 4, "static", rollout_devices=3).throughput
        > simulate(roll, 4, "static", rollout_devices=1).throughput
    )
    train = SMALL.with_overrides(train_tokens_per_s=20.0)
    assert (
        simulate(train, 4, "static", rollout_devices=1).throughput
        > simulate(train, 4, "static", rollout_devices=3).throughput
    )
    from trainer.elastic.simulator import plot_pools

    plot_pools(res, str(tmp_path / "pools.png"))
    assert (tmp_path / "pools.png").stat().st_size > 1000


def test_workloads_document_sources():
    for w in WORKLOADS.values():
        assert w.sources and w.description
    with pytest.raises(ValueError, match="unknown fields"):
        SMALL.with_overrides(nope=1)


def test_critical_path_bound_bounds_every_policy():
    from trainer.elastic.simulator import critical_path_bound

    res = compare(SMALL, 4)
    tp = res["throughput"]
    bound = critical_path_bound(SMALL, 4)
    assert res["bound_throughput"] == pytest.approx(bound)
    assert all(v <= bound * (1 + 1e-9) for v in tp.values())
    assert all(v <= bound * (1 + 1e-9) for v in res["static_grid"].values())
    assert res["bound_vs_static_async"] == pytest.approx(bound / tp["static_async"])


def test_shared_host_model():
    """A shared host (CPU slots): serial host work per episode, processor sharing, one batch at a time."""
    one_turn = SMALL.with_overrides(
        turns_median=1.0,
        turns_sigma=0.0,
        max_turns=1,
        tokens_median=16.0,
        tokens_sigma=0.0,
        max_new_tokens=16,
        prompt_tokens=20,
        obs_tokens=0,
        train_fixed_s=0.01,
        train_tokens_per_s=1e7,
        weight_sync_s=0.0,
        decode_base_s=0.002,
        decode_per_seq_s=0.0001,
    )
    free = simulate(one_turn, 3, "static", rollout_devices=2)
    # serial host work of h per episode caps throughput at 1/h, and that cap binds here
    h = 0.01
    hosted = simulate(one_turn.with_overrides(host_episode_s=h), 3, "static", rollout_devices=2)
    assert hosted.throughput <= 1 / h + 1e-9
    assert hosted.throughput > 0.6 / h and hosted.throughput < free.throughput
    # two generating slots + the learner on one core: everything runs at a fraction of its speed
    shared = simulate(one_turn.with_overrides(host_cpus=1.0), 3, "static", rollout_devices=2)
    assert shared.throughput < 0.75 * free.throughput
    # ... and on as many cores as workers, sharing costs nothing
    roomy = simulate(one_turn.with_overrides(host_cpus=8.0), 3, "static", rollout_devices=2)
    assert roomy.throughput == pytest.approx(free.throughput)
    # one batch at a time (the embedded RolloutThread) never beats overlapping batches
    serial = simulate(SMALL.with_overrides(overlap_batches=False), 4, "static", rollout_devices=2)
    assert serial.throughput <= simulate(SMALL, 4, "static", rollout_devices=2).throughput
    elastic = simulate(
        one_turn.with_overrides(host_episode_s=h, host_cpus=2.0), 3, "elastic", rollout_devices=2
    )
    assert elastic.trajectories == one_turn.steps * one_turn.batch_size


class _Scripted:
    """A controller that makes one move once ``when(telemetry)`` holds (a fixed test input)."""

    def __init__(self, move, when) -> None:
        self.move, self.when, self.done = move, when, False

    def decide(self, t):
        if not self.done and not t.moving and self.when(t):
            self.done = True
            return self.move
        return None


def _run(w, n, rollout, controller):
    from trainer.elastic.controller import MigrationPolicy
    from trainer.elastic.simulator import _Sim

    return _Sim(w, n, "elastic", rollout, 0, controller, MigrationPolicy(w.prefill_speedup)).run()


def test_a_running_step_grows_onto_a_lent_device():
    """A device that joins the train pool mid-step takes micro-batches from then on."""
    from trainer.elastic.controller import Move

    heavy = SMALL.with_overrides(train_tokens_per_s=40.0, steps=2, realloc_s=1.0, weight_sync_s=0.0)

    def lend():
        return _Scripted(
            Move("train", 1, "test"), lambda t: t.time_s > 200
        )  # step 0 runs from ~60 s to ~1000 s

    grown = _run(heavy, 4, 3, lend())
    fixed = _run(heavy.with_overrides(grow_steps=False), 4, 3, lend())
    assert grown.moves == fixed.moves == 1
    assert grown.makespan_s < fixed.makespan_s
    assert grown.trajectories == fixed.trajectories == heavy.steps * heavy.batch_size


def test_kv_cache_budget_limits_admission():
    roomy = simulate(SMALL, 4, "static", rollout_devices=2)
    tight = simulate(SMALL.with_overrides(kv_tokens=3 * SMALL.prompt_tokens), 4, "static", rollout_devices=2)
    assert tight.throughput < roomy.throughput
    assert tight.trajectories == SMALL.steps * SMALL.batch_size


def test_draining_a_full_pool_requeues_its_episodes_without_dropping_any():
    """Leaving a full rollout pool: live episodes wait for a free slot, then re-prefill; none is lost."""
    from trainer.elastic.controller import Move

    full = SMALL.with_overrides(max_live=4, prefill_speedup=1e6)  # re-prefill is nearly free: always migrate
    res = _run(full, 4, 3, _Scripted(Move("train", 1, "test"), lambda t: t.queue_depth > 0 and t.time_s > 0))
    assert res.moves == 1 and res.migrations > 0
    assert res.trajectories == full.steps * full.batch_size


def test_bound_counts_the_work_of_slot_bound_rollout():
    from trainer.elastic.simulator import critical_path_bound

    few = SMALL.with_overrides(max_live=2)
    assert critical_path_bound(few, 4) < critical_path_bound(SMALL, 4)
    for policy in ("static", "elastic"):
        assert simulate(few, 4, policy, rollout_devices=2).throughput <= critical_path_bound(few, 4) * (
            1 + 1e-9
        )


def test_colocated_async_reference():
    """The reference policy: every device trains each step and generation pauses meanwhile."""
    from trainer.elastic.simulator import critical_path_bound

    ref = simulate(SMALL, 4, "colocated_async")
    assert ref.trajectories == SMALL.steps * SMALL.batch_size
    assert ref == simulate(SMALL, 4, "colocated_async")  # deterministic
    # under the staleness bound it overlaps batches, so it is no slower than lock-step colocated
    assert ref.throughput >= simulate(SMALL, 4, "colocated").throughput
    # with no staleness allowed there is nothing to overlap: it is colocated-sync exactly
    sync = SMALL.with_overrides(max_policy_lag=0)
    assert simulate(sync, 4, "colocated_async").makespan_s == pytest.approx(
        simulate(sync, 4, "colocated").makespan_s
    )
    # generation really pauses during steps: a longer step switch costs the whole cluster
    slow_switch = SMALL.with_overrides(colocated_switch_s=SMALL.colocated_switch_s + 50.0)
    assert simulate(slow_switch, 4, "colocated_async").makespan_s > ref.makespan_s + 50.0 * (SMALL.steps - 1)
    assert ref.throughput <= critical_path_bound(SMALL, 4) * (1 + 1e-9)
    res = compare(SMALL, 4)
    assert res["colocated_async_vs_static_async"] == pytest.approx(
        res["colocated_async_throughput"] / res["throughput"]["static_async"]
    )
