"""Validate the elastic simulator against the real embedded runtime on CPU slots.

1. Calibrate: measure the component costs the simulator needs on this machine -- decode step time
   of one slot's HFEngine at 1 and at ``B`` concurrent sequences, prefill vs decode cost, one
   weight load (``set_weights``), the episode shape (policy tokens per episode, env step time),
   how much decode work the rollout slots' engines really do in parallel in one process (the
   GIL: the simulator's ``host_cpus``), and the wall time of the real rollout alone (episode
   runner on the slot engines, no learner), from which the serial host time per episode that
   the simulator needs to reproduce it is fitted (it is far above the host's CPU time: GIL
   hand-offs, polling and batching waits are serial time that is not CPU).
2. Run the real runtime (:class:`trainer.elastic.ElasticHooks` on a Trainer: schedule, staleness bound,
   ledger, tree, one HFEngine per slot, the Learner on the train pool) twice on the same small
   math workload: a static split and elastic pools driven by the ElasticController. Training step
   times per train-pool size are measured in these runs (they are a component cost, like decode).
   The static run also measures the host's share: CPU seconds of the whole process minus the
   engines' batching threads minus the learner's steps, per episode (env creation, reward check,
   tree and ledger SQLite writes, the event loop, batch export) -- ``host_episode_s`` -- and the
   learner's CPU seconds per step (its work, free of contention).
3. Feed the measured costs into :mod:`trainer.elastic.simulator` and predict both runs' throughput
   (trajectories per second). Print measured, predicted and the relative error (goal: within 20%).
   Two predictions are printed: the bare model (every slot its own hardware, no host work,
   batches overlapping: what a GPU cluster looks like) and the model of this runtime on this
   machine: ``host_cpus`` cores shared by the generating slots, the learner and one host thread
   (processor sharing), the measured host work per episode on that host thread, and one batch at
   a time (the embedded RolloutThread gathers batch k before starting k+1).

Each split runs ``--repeats`` times (default 3) in alternating order; the median run is compared,
and the run-to-run spread is printed next to it: on this machine the spread of a 12-second run is
itself several percent, which is the floor of any comparison.

Usage: ``python benchmarks/elastic_validation.py [--steps 12] [--batch 32] [--slots 3] [--repeats 3]``
(about two minutes on an idle 2-core machine; the measurements are only meaningful on an otherwise
idle machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import tempfile
import time

import torch


def calibrate_decode(model, tok, batch: int) -> tuple[float, float, float, float]:
    """(decode_base_s, decode_per_seq_s, prefill_speedup, weight_load_s) of one slot's engine."""
    from fr_agents.policy.base import SamplingOptions
    from fr_agents.policy.hf import HFEngine

    eng = HFEngine(model, tok, max_batch_size=batch, seed=0)
    opts = SamplingOptions(max_tokens=24, stop_token_ids=())
    prompt = list(range(5, 25))

    def wave(n: int, prompt_len: int, max_tokens: int) -> float:
        p = (prompt * (prompt_len // len(prompt) + 1))[:prompt_len]
        o = SamplingOptions(max_tokens=max_tokens, stop_token_ids=())
        t = time.perf_counter()
        futs = [eng.submit(p, o) for _ in range(n)]
        for f in futs:
            f.result()
        return time.perf_counter() - t

    wave(2, 20, 4)  # warm up
    per_step = {}
    for n in (1, batch):
        t_long = min(wave(n, 20, opts.max_tokens) for _ in range(2))
        t_short = min(wave(n, 20, 4) for _ in range(2))
        per_step[n] = (t_long - t_short) / (opts.max_tokens - 4)
    per_seq = max(0.0, (per_step[batch] - per_step[1]) / (batch - 1))
    base = max(1e-5, per_step[1] - per_seq)
    # prefill: one extra prompt token costs (t(P2) - t(P1)) / (P2 - P1); compare with a decode step
    t1 = min(wave(1, 20, 1) for _ in range(3))
    t2 = min(wave(1, 400, 1) for _ in range(3))
    per_prefill_token = max(1e-7, (t2 - t1) / 380)
    speedup = per_step[1] / per_prefill_token
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    t = time.perf_counter()
    for _ in range(3):
        eng.set_weights(sd, 1)
    load = (time.perf_counter() - t) / 3
    eng.close_sync()
    return base, per_seq, speedup, load


def calibrate_parallelism(model, tok, batch: int, engines: int) -> float:
    """Effective parallel capacity (cores) of ``engines`` slot engines decoding at once in this process.

    One engine decodes a wave of ``batch`` sequences alone (``T1``); then ``engines`` engines each
    decode the same wave at the same time (``Tn``). ``engines * T1 / Tn`` is how many engines'
    worth of work the process really does in parallel -- below the core count when the engines'
    Python loops (and the GIL) serialise them, as with tiny models whose ops are short.
    """
    import copy

    from fr_agents.policy.base import SamplingOptions
    from fr_agents.policy.hf import HFEngine

    engs = [HFEngine(copy.deepcopy(model), tok, max_batch_size=batch, seed=i) for i in range(engines)]
    opts = SamplingOptions(max_tokens=24, stop_token_ids=())
    prompt = list(range(5, 25))

    def wave(es) -> float:
        t = time.perf_counter()
        futs = [e.submit(prompt, opts) for e in es for _ in range(batch)]
        for f in futs:
            f.result()
        return time.perf_counter() - t

    wave(engs)  # warm up every engine thread
    t1 = min(wave(engs[:1]) for _ in range(3))
    tn = min(wave(engs) for _ in range(3))
    for e in engs:
        e.close_sync()
    return max(1.0, engines * t1 / tn)


def measure_rollout_alone(cfg, slots: int, rollout: int, batches: int = 3) -> float:
    """Wall seconds per batch of the real rollout alone: the runtime's episode runner on the
    ``rollout`` slot engines of :class:`~trainer.elastic.ElasticHooks` on a Trainer (env, reward check,
    tree writes, event loop), no learner running. A component cost, like the decode waves."""
    import asyncio

    from trainer.elastic import ElasticHooks
    from trainer.loop import Trainer

    hooks = ElasticHooks(cfg, devices=slots, rollout=rollout, elastic=False)
    t = Trainer(cfg, tempfile.mkdtemp(prefix="fr-rollout-"), console=False, hooks=hooks)
    t.build()
    side = t.rollout_side
    try:

        async def main() -> float:  # one event loop, as the RolloutThread has
            await asyncio.gather(*(side.runner.run(spec) for spec in side.schedule.episodes(0)))  # warm up
            start = time.perf_counter()
            for k in range(1, batches + 1):
                await asyncio.gather(*(side.runner.run(spec) for spec in side.schedule.episodes(k)))
            return (time.perf_counter() - start) / batches

        return asyncio.run(main())
    finally:
        hooks.run_ended()
        side.close()


def fit_host_episode_s(w, slots: int, rollout: int, batch_wall_s: float) -> float:
    """The serial host work per episode with which the simulator's rollout-alone batch (no
    learner, no weight sync) takes the measured ``batch_wall_s`` (bisection; 0 if decode alone
    already takes longer)."""
    from trainer.elastic.simulator import simulate

    alone = dataclasses.replace(
        w, steps=1, max_policy_lag=0, train_fixed_s=0.0, train_tokens_per_s=1e12, weight_sync_s=0.0
    )

    def wall(h: float) -> float:
        return simulate(
            dataclasses.replace(alone, host_episode_s=h), slots, "static", rollout_devices=rollout
        ).makespan_s

    lo, hi = 0.0, batch_wall_s / w.batch_size
    if wall(lo) >= batch_wall_s:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wall(mid) < batch_wall_s else (lo, mid)
    return (lo + hi) / 2


def run(cfg, slots: int, rollout: int, elastic: bool, tick_s: float):
    from trainer.elastic import ElasticHooks
    from trainer.elastic.controller import ControllerConfig
    from trainer.loop import Trainer

    t = ElasticHooks(
        cfg, devices=slots, rollout=rollout, elastic=elastic, controller=ControllerConfig(), tick_s=tick_s
    )
    return t, Trainer(cfg, tempfile.mkdtemp(prefix="fr-elastic-"), console=False, hooks=[t]).run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--tick", type=float, default=0.5)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each split, alternating their order (median is compared)",
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    import logging

    logging.basicConfig(level=logging.WARNING)
    from fr_agents.config import load_config
    from fr_agents.ledger import EpisodeLedger
    from fr_agents.models import load_policy, tiny_dir
    from trainer.elastic.controller import ControllerConfig
    from trainer.elastic.simulator import Workload, simulate

    overrides = [
        "trainer.backend=local",  # the elastic runtime's hooks act inside the rollout
        "model.tiny_size=micro",
        "tasks.params={digits: 2}",
        f"trainer.batch_size={a.batch}",
        f"rollout.concurrency={a.batch}",
        "rollout.max_policy_lag=1",
        f"trainer.steps={a.steps}",
        "trainer.max_minutes=0",
        "trainer.plateau_patience=0",
        "trainer.eval_episodes=0",
        "warm_start.examples=0",
        "trainer.collapse_guard=false",
        "trainer.checkpoint_every=0",
        "trainer.plot_every=1000",
        "rollout.max_new_tokens=16",
    ]
    cfg = load_config("math-tiny", overrides)
    model, tok = load_policy(str(tiny_dir("micro", 0)), "float32", "cpu")
    base, per_seq, speedup, load = calibrate_decode(model.eval(), tok, a.batch)
    print(
        f"calibration: decode step {1e3 * base:.2f} ms + {1e3 * per_seq:.3f} "
        f"ms/seq, prefill speedup {speedup:.1f}, weight load {1e3 * load:.1f} ms"
    )

    r_static = max(1, a.slots - 1)
    par = calibrate_parallelism(model, tok, max(1, a.batch // r_static), r_static)
    print(
        f"calibration: {r_static} slot engines decoding at once do the work of "
        f"{par:.2f} (one process, {os.cpu_count()} cores)"
    )
    rollout_wall = measure_rollout_alone(cfg, a.slots, r_static)
    print(f"calibration: rollout alone on {r_static} slots: {rollout_wall:.2f}s per batch of {a.batch}")
    # warm-up run (discarded): first-use costs (thread pools, allocator, SQLite) would land on the
    # first measured run
    run(
        load_config(
            "math-tiny", [*(o for o in overrides if not o.startswith("trainer.steps=")), "trainer.steps=2"]
        ),
        a.slots,
        r_static,
        False,
        a.tick,
    )
    # each split runs `repeats` times, in alternating order (s e, e s, s e, ...) so that drift of the
    # machine (caches, allocator, thermal) does not favour one; the median run is what is compared
    measured: dict[str, list[float]] = {"static": [], "elastic": []}
    runs: dict[str, list] = {"static": [], "elastic": []}
    order = [("static", False), ("elastic", True)]
    for i in range(max(1, a.repeats)):
        for name, elastic in order if i % 2 == 0 else order[::-1]:
            t, res = run(cfg, a.slots, r_static, elastic, a.tick)
            thr = a.steps * a.batch / res.rl_s
            measured[name].append(thr)
            runs[name].append(t)
            led = EpisodeLedger(res.run_dir / "episodes.sqlite")
            t.episode_tokens = [r[3] for k in range(res.steps) for r in led.batch_rows(k)]
            led.close()
            print(
                f"measured {name:<8} {thr:.2f} traj/s  ({res.steps} steps in {res.rl_s:.1f}s; moves "
                f"{t.pool.stats.moves_to_train}->train {t.pool.stats.moves_to_rollout}->rollout, "
                f"{t.grown_steps} steps grew; step seconds by train slots {_by_n(t.step_seconds)})"
            )
    for name, values in measured.items():
        print(
            f"measured {name:<8} median {statistics.median(values):.2f} traj/s over "
            f"{len(values)} runs (min {min(values):.2f}, max {max(values):.2f}: "
            f"run-to-run spread {100 * (max(values) / min(values) - 1):.1f}%)"
        )
    all_runs = runs["static"] + runs["elastic"]

    # -------------------------------------------------------------- the simulator, fed measured costs
    toks = [x for t in all_runs for x in t.episode_tokens]
    mean_tok = statistics.fmean(toks)
    sigma = statistics.pstdev([math.log(max(1, x)) for x in toks])
    steps_by_n = _by_n([row for t in all_runs for row in t.step_seconds])
    batch_tokens = a.batch * (mean_tok + 20)
    t1 = steps_by_n[1]  # wall seconds (contended) -- the bare model's learner cost
    cpu = _pool_cpu([t.cpu_seconds for t in runs["static"]])
    # the learner thread's CPU outside its steps (export, publish, metrics) is per-step work on the
    # learner's critical path; the rest of the host's CPU is per-episode rollout-side work
    step_overhead = max(0.0, cpu["main"] - cpu["learner"]) / max(1.0, cpu["steps"])
    host_s = max(0.0, cpu["process"] - cpu["engines"] - cpu["main"]) / max(1.0, cpu["episodes"])
    t1_cpu = statistics.median([c for t in runs["static"] for n, c in t.step_cpu_seconds if n == 1])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ecpu = _pool_cpu([t.cpu_seconds for t in runs["elastic"]])
    print(
        f"static run CPU: process {cpu['process']:.1f}s = engines {cpu['engines']:.1f}s + learner "
        f"{cpu['learner']:.1f}s + learner-thread overhead {cpu['main'] - cpu['learner']:.1f}s + "
        f"host {cpu['process'] - cpu['engines'] - cpu['main']:.1f}s for {cpu['episodes']:.0f} "
        f"episodes -> host {1e3 * host_s:.1f} ms/episode, {step_overhead:.2f}s/step outside the "
        f"step; learner step {t1_cpu:.2f}s CPU vs {t1:.2f}s wall; {cores} cores"
    )
    if ecpu:
        print(
            "elastic run CPU (for comparison): host "
            f"{1e3 * max(0.0, ecpu['process'] - ecpu['engines'] - ecpu['main']) / max(1.0, ecpu['episodes']):.1f}"  # noqa: E501
            " ms/episode"
        )
    if 2 in steps_by_n:
        alpha = math.log(t1 / steps_by_n[2]) / math.log(2)
    else:
        alpha = 1.0
    w = Workload(
        name="cpu-validation",
        description="math-tiny on CPU slots (measured costs)",
        sources=("measured here",),
        batch_size=a.batch,
        steps=a.steps,
        max_policy_lag=1,
        turns_median=1,
        turns_sigma=0.0,
        max_turns=1,
        tokens_median=math.exp(statistics.fmean([math.log(max(1, x)) for x in toks])),
        tokens_sigma=sigma,
        max_new_tokens=16,
        prompt_tokens=20,
        obs_tokens=0,
        tool_median_s=1e-3,
        tool_sigma=0.0,
        tool_max_s=1e-3,
        length_growth=1.0,
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        max_live=max(1, a.batch // r_static),
        prefill_speedup=speedup,
        train_tokens_per_s=batch_tokens / t1,
        train_alpha=alpha,
        train_fixed_s=0.0,
        weight_sync_s=load,
        realloc_s=load,
        colocated_switch_s=load,
        tick_s=a.tick,
    )
    print(
        f"workload fed to the simulator: mean {mean_tok:.1f} policy "
        f"tokens/episode, train step {t1:.2f}s on 1 slot, alpha {alpha:.2f}"
    )
    # the runtime gives the learner at most (cores - serving slots) threads (ElasticHooks.learner_threads):
    # with one serving slot at least, a second train slot adds a thread only with >= 3 cores
    host_alpha = alpha if cores - 1 >= 2 else 0.0
    host = dataclasses.replace(
        w,
        name="cpu-validation-host",
        train_tokens_per_s=batch_tokens / t1_cpu,
        train_fixed_s=step_overhead,
        train_alpha=host_alpha,
        host_episode_s=host_s,
        host_cpus=min(float(cores), par),
        overlap_batches=False,
    )
    host_fit = fit_host_episode_s(host, a.slots, r_static, rollout_wall)
    print(
        f"host work per episode: {1e3 * host_s:.1f} ms CPU (static run) vs "
        f"{1e3 * host_fit:.1f} ms to match the rollout-alone wall time (the rest: GIL "
        "hand-offs, polling, batching waits -- serial time that is not CPU)"
    )
    host = dataclasses.replace(host, host_episode_s=max(host_s, host_fit))
    med = {name: statistics.median(v) for name, v in measured.items()}
    for label, model in (("bare model", w), ("host model", host)):
        sims = {
            "static": simulate(model, a.slots, "static", rollout_devices=r_static),
            "elastic": simulate(
                model, a.slots, "elastic", rollout_devices=r_static, controller=ControllerConfig()
            ),
        }
        pred = {name: r.throughput for name, r in sims.items()}
        worst = worst_any = 0.0
        for name in ("static", "elastic"):
            err = (pred[name] - med[name]) / med[name]
            errs = [(pred[name] - m) / m for m in measured[name]]
            worst = max(worst, abs(err))
            worst_any = max(worst_any, *(abs(e) for e in errs))
            print(
                f"[{label}] {name:<8} measured {med[name]:.2f} traj/s (median), predicted "
                f"{pred[name]:.2f} traj/s ({sims[name].moves} moves), error "
                f"{100 * err:+.1f}% (per run {', '.join(f'{100 * e:+.1f}%' for e in errs)})"
            )
        ratio_m = med["elastic"] / med["static"]
        ratio_p = pred["elastic"] / pred["static"]
        print(
            f"[{label}] elastic/static: measured {ratio_m:.2f}x, predicted {ratio_p:.2f}x; worst "
            f"error {100 * worst:.1f}% (of the medians), {100 * worst_any:.1f}% (of any single run)"
        )
    print(
        f"worst prediction error of the host model {100 * worst:.1f}% against the median runs, "
        f"{100 * worst_any:.1f}% against any single run (goal <= 20%): {'PASS' if worst <= 0.2 else 'MISS'}"
    )


def _pool_cpu(marks: list[dict[str, float]]) -> dict[str, float]:
    """Sum the CPU-second splits of several runs (each from ElasticHooks.cpu_seconds)."""
    out: dict[str, float] = {}
    for m in marks:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _by_n(rows: list[tuple[int, float]]) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for n, s in rows:
        out.setdefault(n, []).append(s)
    return {n: round(statistics.median(v), 3) for n, v in sorted(out.items())}


if __name__ == "__main__":
    main()
