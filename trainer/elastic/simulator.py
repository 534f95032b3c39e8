"""A discrete-event model of RL training on a cluster: colocated-sync, static async, elastic.

What is modelled (each piece mirrors a mechanism of the runtime in :mod:`trainer.loop` and
:mod:`trainer.elastic.pools`):

* **Episodes.** Batch ``k`` is a fixed list of ``batch_size`` episodes (as
  :class:`~trainer.batches.EpisodeSchedule`). An episode is a list of turns; a turn is a
  generation of ``tokens`` decode tokens (after prefilling the turn's new tokens), then a tool/env
  call taking ``latency`` seconds during which the episode holds its KV slot but no compute.
  Turn counts, tokens per turn and tool latencies are log-normal (long-tailed) and capped; the
  same seed gives the same episodes for every policy (common random numbers).
* **Rollout devices.** A device holds at most ``max_live`` live episodes and, with
  ``kv_tokens > 0``, admits one only while the prefixes it holds leave room in its KV cache
  (prefixes grow with every turn; a device over budget admits nothing until some finish). Its decode
  step takes ``decode_base_s + decode_per_seq_s * n`` for ``n`` generating sequences, each of which
  gains one token per step (processor sharing: memory-bound decode is nearly flat in ``n`` until it
  saturates). Prefill of ``p`` tokens costs ``p / prefill_speedup`` decode steps of work.
* **Admission.** Batch ``k`` may start once the learner has published version
  ``k - max_policy_lag`` (0 for colocated-sync); admissible episodes wait in a FIFO queue for a
  free slot on the least-loaded admitting device (that queue is the telemetry's queue depth).
* **Learner.** Step ``k`` waits for every episode of batch ``k``, runs on the devices of the train
  pool in ``train_fixed_s + tokens / (train_tokens_per_s * n ** train_alpha)`` seconds
  (``tokens``: all tokens of the batch), then publishes weights: every rollout device pauses
  ``weight_sync_s``. A device that joins the train pool while a step runs takes its share of the
  remaining micro-batches (``grow_steps``; the runtime's learner does the same at micro-batch
  boundaries); devices never leave a running step.
* **Colocated-sync.** Every device generates batch ``k`` with version ``k``; then every device
  trains (``colocated_switch_s`` per step for switching engines and reloading weights).
* **Colocated-async (a reference).** Every device generates under the async staleness bound and
  every device trains each step: generation pauses on all devices (live episodes keep their KV
  cache; tool calls go on) from the step's start until it ends, ``colocated_switch_s`` included.
  That is an elastic policy that hands the whole cluster to every step and back, with no drain,
  at the colocated switch cost -- a yardstick for what reallocation gains on a workload (not
  an upper bound: see :func:`critical_path_bound`), and not a policy the runtime offers.
* **Moves (elastic).** The :class:`~trainer.elastic.controller.ElasticController` reads the same telemetry as
  in the runtime every ``tick_s``. A device leaving rollout stops admitting; each live episode, at
  its next turn, either re-prefills its whole prefix on another device -- waiting, ahead of new
  episodes, for the first free slot when none has room -- or finishes in place
  (:class:`~trainer.elastic.controller.MigrationPolicy`); then the device pays ``realloc_s`` and joins the
  train pool. A device joining rollout leaves after the learner step that uses it, pays
  ``realloc_s`` (loading the current weights), then admits episodes.

* **A shared host (CPU slots only; off for GPU workloads).** ``host_cpus > 0``: the generating
  devices, the learner's devices and one host thread share that many cores; with ``a`` of them
  active each runs at ``min(1, host_cpus / a)`` of its speed (processor sharing). Each finished
  episode then needs ``host_episode_s`` of serial host work (env, reward check, SQLite writes,
  the event loop -- one thread and the GIL) before it counts, holding its slot meanwhile.
  ``overlap_batches=False`` admits batch ``k + 1`` only after batch ``k`` has finished, as the
  embedded :class:`~trainer.rollout_thread.RolloutThread` does; a cluster runtime overlaps them.

Throughput is trajectories consumed by the learner per second over the whole run.
:func:`critical_path_bound` gives an upper bound on any device policy's throughput (the
stragglers' own chains of turns, the staleness bound, training on every device; and the
device-seconds the run's rollout and training need at the least), which tells how much room a
reallocation policy has at all.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from trainer.elastic.controller import (
    ControllerConfig,
    ElasticController,
    MigrationPolicy,
    Telemetry,
    TelemetryWindow,
    spare_fraction,
)

# =========================================================================== workloads


@dataclass(frozen=True)
class Workload:
    """Episode shape and hardware costs of one setting (see :data:`WORKLOADS` for sources)."""

    name: str
    description: str
    sources: tuple[str, ...]
    batch_size: int
    steps: int
    max_policy_lag: int
    # episode shape (log-normal medians / sigmas, hard caps)
    turns_median: float
    turns_sigma: float
    max_turns: int
    tokens_median: float
    tokens_sigma: float
    max_new_tokens: int
    prompt_tokens: int
    obs_tokens: int
    tool_median_s: float
    tool_sigma: float
    tool_max_s: float
    length_growth: float  # per-turn tokens at the last step / at the first (responses grow in RL)
    # hardware, per device
    decode_base_s: float
    decode_per_seq_s: float
    max_live: int  # live episodes per device at most (scheduler slots)
    prefill_speedup: float
    train_tokens_per_s: float
    train_alpha: float
    train_fixed_s: float
    weight_sync_s: float
    realloc_s: float
    colocated_switch_s: float
    tick_s: float = 5.0
    # a shared host (the CPU-slot runtime; leave the defaults for a GPU cluster)
    host_episode_s: float = 0.0  # serial host work per episode: env, reward check, store writes
    host_cpus: float = 0.0  # > 0: devices, learner and host share this many cores
    overlap_batches: bool = True  # False: batch k+1 starts after batch k ends (embedded RolloutThread)
    # KV-cache capacity of one rollout device in tokens (0: only ``max_live`` limits admission)
    kv_tokens: float = 0.0
    # a device joining the train pool during a step takes micro-batches from then on (False: a
    # step keeps the devices it started with)
    grow_steps: bool = True

    def with_overrides(self, **kw: Any) -> Workload:
        bad = [k for k in kw if k not in self.__dataclass_fields__]
        if bad:
            raise ValueError(f"workload {self.name}: unknown fields {bad}")
        return replace(self, **kw)


_H100_7B = dict(  # Qwen2.5-7B bf16 on one H100/H200-class GPU (vLLM decode, FSDP training)
    decode_base_s=0.025,  # ~40 tokens/s for one sequence
    decode_per_seq_s=0.0004,  # saturates around a few hundred sequences
    max_live=128,  # scheduler slots
    kv_tokens=1.0e6,  # KV cache: 57,344 bytes/token for Qwen2.5-7B, ~52 GB free on an 80 GB GPU (see xlong)
    prefill_speedup=200.0,  # prefill ~8k tokens/s vs one decode step per token
    train_tokens_per_s=6000.0,  # fwd+bwd of 7B at ~35% MFU
    train_alpha=0.9,  # data-parallel scaling exponent (communication)
    train_fixed_s=4.0,  # optimizer step, sharded parameter gather
    weight_sync_s=2.0,  # 15 GB NCCL broadcast + load into the engine
    realloc_s=15.0,  # engine start / KV cache allocation, or joining the training group
    colocated_switch_s=10.0,  # sleep/wake both engines each step (offload, reload, resync)
)

WORKLOADS: dict[str, Workload] = {
    # xlong: what is sourced and what is assumed, plainly.
    # * Sourced (the P3 issue text only): "long-tailed rollout durations with multi-turn tool
    #   latency"; QwenGyre's claim of up to 1.85x over colocated and 1.78x over async RL on such
    #   workloads. The "xLong-horizon description" the issue cites is not available here, so no
    #   number below comes from it.
    # * Derived: the KV-cache budget. Qwen2.5-7B keeps 2 (K, V) x 28 layers x 4 KV heads x 128
    #   dims x 2 bytes = 57,344 bytes per token; an 80 GB GPU at 0.9 memory use, less ~15 GB of
    #   bf16 weights and ~5 GB of activations, holds ~52 GB of KV: ~0.9-1.0M tokens. Episodes of
    #   tens of turns hold 10k-80k tokens each, so the cache, not the 128 scheduler slots, is
    #   what limits a device's live episodes.
    # * Assumed: every shape value -- turns per episode log-normal (median 12, sigma 0.9, cap 100:
    #   p90 ~ 35-40 turns, a few 100-turn episodes per batch), tokens per turn log-normal (median
    #   250, sigma 0.8, growing 2x over the run as responses lengthen), tool latency log-normal
    #   (median 3 s, sigma 1.2, cap 180 s), lag 2 -- the H100/7B hardware constants, and
    #   B = 1024 (64 trajectories per GPU). With B = 256 on 16 GPUs the best static split keeps its
    #   learner busy only ~19% of the time and the GPUs mostly idle; nobody sizes a run like that.
    #   benchmarks/elastic_sim.py also prints the B = 256 variant.
    # * Consequence (measured with critical_path_bound): this workload is bound by its
    #   stragglers. Batch k+3 is admitted when step k ends, and a batch of 1024 episodes takes
    #   ~9x its median episode to finish (its 100-turn episodes); the pipeline runs in waves of
    #   max_policy_lag + 1 batches. On 16 GPUs an ideal device policy reaches only ~1.5x the best static async
    #   split here (~1.1x at B = 256): reallocation cannot shorten one straggler's own chain of
    #   turns and tool calls, only the training steps between them. The colocated_async reference
    #   (the whole cluster to every step and back) reaches 1.10x here, 1.15x on 8 GPUs.
    "xlong": Workload(
        name="xlong",
        description=(
            "xLong-horizon agent tasks: tens of tool turns per episode, "
            "heavy-tailed turn counts and tool latency"
        ),
        sources=(
            "the P3 elastic-pools issue: 'long-tailed rollout durations with "
            "multi-turn tool latency' (QwenGyre's xLong-horizon workload; its "
            "description is not available here, so no number is taken from it)",
            "derived: KV cache of Qwen2.5-7B (57,344 bytes/token) on an 80 GB GPU -> ~1.0M tokens per device",
            "assumed, not measured: turns log-normal median 12 sigma 0.9 cap 100; "
            "tokens/turn log-normal median 250 sigma 0.8 cap 2048, growing 2x over the "
            "run; tool latency log-normal median 3 s sigma 1.2 cap 180 s; B=1024 (64 "
            "per GPU at 16 GPUs), max_policy_lag 2; hardware constants of _H100_7B",
        ),
        batch_size=1024,
        steps=12,
        max_policy_lag=2,
        turns_median=12.0,
        turns_sigma=0.9,
        max_turns=100,
        tokens_median=250.0,
        tokens_sigma=0.8,
        max_new_tokens=2048,
        prompt_tokens=1500,
        obs_tokens=300,
        tool_median_s=3.0,
        tool_sigma=1.2,
        tool_max_s=180.0,
        length_growth=2.0,
        **_H100_7B,
    ),
    "tool": Workload(
        name="tool",
        description=(
            "FlashREINFORCE paper, Python-tool math: Qwen2.5-7B, <=10 turns, 1024 tokens/turn, B=128, lag 2"
        ),
        sources=(
            "FlashREINFORCE paper, tool setting, as mirrored in configs/python-tool-qwen2.5-7b.yaml "
            "(max_turns 10, max_new_tokens 1024, batch_size 128, max_policy_lag 2)",
            "turn/token/latency distributions are assumptions (most episodes use 2-4 tool calls)",
        ),
        batch_size=128,
        steps=24,
        max_policy_lag=2,
        turns_median=3.0,
        turns_sigma=0.6,
        max_turns=10,
        tokens_median=350.0,
        tokens_sigma=0.7,
        max_new_tokens=1024,
        prompt_tokens=400,
        obs_tokens=120,
        tool_median_s=0.5,
        tool_sigma=0.8,
        tool_max_s=30.0,
        length_growth=1.5,
        **_H100_7B,
    ),
    "alfworld": Workload(
        name="alfworld",
        description="FlashREINFORCE paper, ALFWorld: Qwen2.5-7B, <=50 turns, 256 tokens/turn, B=64, lag 2",
        sources=(
            "FlashREINFORCE paper, ALFWorld setting, as mirrored in configs/alfworld-qwen2.5-7b.yaml "
            "(max_turns 50, max_new_tokens 256, batch_size 64, max_policy_lag 2)",
            "turn/token/latency distributions are assumptions (text-world env steps take milliseconds)",
        ),
        batch_size=64,
        steps=24,
        max_policy_lag=2,
        turns_median=18.0,
        turns_sigma=0.6,
        max_turns=50,
        tokens_median=60.0,
        tokens_sigma=0.6,
        max_new_tokens=256,
        prompt_tokens=900,
        obs_tokens=80,
        tool_median_s=0.05,
        tool_sigma=0.5,
        tool_max_s=2.0,
        length_growth=1.3,
        **_H100_7B,
    ),
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"--workload: unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    return WORKLOADS[name]


# =========================================================================== episodes


@dataclass
class Episode:
    index: int
    batch: int
    turns: list[tuple[float, float]]  # (decode tokens, tool latency)
    prefix: float = 0.0  # tokens held so far (prompt + turns + observations)
    turn: int = 0
    device: int = -1
    pinned: bool = False
    migrations: int = 0

    @property
    def tokens(self) -> float:
        return self.prefix


def make_episodes(w: Workload, batch: int, seed: int) -> list[Episode]:
    """Batch ``batch``'s episodes; depends only on (workload, batch, seed)."""
    rng = np.random.default_rng([seed, batch, 7919])
    growth = 1.0 + (w.length_growth - 1.0) * (batch / max(1, w.steps - 1))
    out = []
    for j in range(w.batch_size):
        n = int(min(w.max_turns, max(1, round(rng.lognormal(math.log(w.turns_median), w.turns_sigma)))))
        toks = np.minimum(
            w.max_new_tokens,
            np.maximum(1, rng.lognormal(math.log(w.tokens_median), w.tokens_sigma, n) * growth),
        )
        lat = np.minimum(w.tool_max_s, rng.lognormal(math.log(w.tool_median_s), w.tool_sigma, n))
        lat[-1] = 0.0  # the last turn ends the episode (its reward is cheap)
        out.append(
            Episode(
                batch * w.batch_size + j, batch, list(zip(toks.round().tolist(), lat.tolist(), strict=True))
            )
        )
    return out


# =========================================================================== simulation state


ROLLOUT, DRAINING, TO_TRAIN, TRAIN, TO_ROLLOUT = "rollout", "draining", "to_train", "train", "to_rollout"
_WHOLE_CLUSTER = ("colocated", "colocated_async")  # policies where every device both generates and trains


@dataclass
class _Dev:
    i: int
    state: str
    live: set[int] = field(default_factory=set)
    gen: list[tuple[float, int]] = field(default_factory=list)  # heap of (virtual finish, episode)
    kv: float = 0.0  # tokens its live episodes hold (their prefixes: the KV cache in use)
    vt: float = 0.0  # tokens each generating sequence has received
    t: float = 0.0  # time vt refers to
    paused_until: float = 0.0
    stamp: int = 0  # invalidates stale heap events
    leave_after_step: bool = False


@dataclass
class SimResult:
    policy: str
    devices: int
    rollout_devices: int | None
    makespan_s: float
    trajectories: int
    throughput: float  # trajectories per second
    learner_busy_frac: float
    moves: int
    migrations: int
    finished_in_place: int
    turns: int  # turns generated: the work simulated (equal for every policy under one seed)
    tokens: float  # tokens generated and observed in all batches (likewise)
    pool_trace: list[tuple[float, int, int]]  # (time, rollout devices, train devices)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("pool_trace")
        return d


class _Sim:
    """One run of one policy; see the module docstring for the model."""

    def __init__(
        self,
        w: Workload,
        n_devices: int,
        policy: str,
        rollout_devices: int,
        seed: int,
        controller: ElasticController | None,
        migration: MigrationPolicy,
    ) -> None:
        self.w, self.n, self.policy, self.seed = w, n_devices, policy, seed
        self.colocated = policy in _WHOLE_CLUSTER
        self.sliced = policy == "colocated_async"  # generation pauses on every device during a step
        self.lag = 0 if policy == "colocated" else w.max_policy_lag
        r = n_devices if self.colocated else rollout_devices
        self.devs = [_Dev(i, ROLLOUT if i < r else TRAIN) for i in range(n_devices)]
        self.controller = controller
        self.migration = migration
        self.now = 0.0
        self.events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, id, stamp)
        self.seq = 0
        self.eps: dict[int, Episode] = {}
        self.queue: deque[int] = deque()  # admitted episodes waiting for their first slot
        self.resume: deque[int] = deque()  # live episodes moved off a draining device, waiting for a slot
        self.next_batch = 0
        self.remaining: dict[int, int] = {}  # batch -> unfinished episodes
        self.batch_tokens: dict[int, float] = {}
        self.turns_run = 0
        self.version = 0
        self.learner_busy_until: float | None = None
        self.learner_devs: list[int] = []
        self.learner_busy_s = 0.0
        self.finished_unconsumed = 0
        self.window = TelemetryWindow(tau_s=max(4 * w.tick_s, 1e-3))
        self.moves = 0
        self.migrations = 0
        self.in_place = 0
        self.trace: list[tuple[float, int, int]] = []
        # concurrent generations at which decode time per step has doubled: the device is busy
        self.saturation = max(1.0, w.decode_base_s / w.decode_per_seq_s)
        self.mean_turn_tokens = w.tokens_median * math.exp(w.tokens_sigma**2 / 2)
        self.speed = 1.0  # processor-sharing factor on a shared host (1.0 without one)
        self.learner_fixed = self.learner_work = self.learner_t = self.learner_start = 0.0
        self.last_step_s = 0.0
        self.finished_total = self.finished_seen = 0
        self.learner_stamp = 0
        self.host_q: deque[int] = deque()
        self.host_cur: int | None = None
        self.host_work = self.host_t = 0.0
        self.host_stamp = 0

    # ------------------------------------------------------------------ helpers

    def push(self, t: float, kind: str, ident: int = 0, stamp: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, ident, stamp))

    def rate(self, d: _Dev) -> float:
        return self.speed / (self.w.decode_base_s + self.w.decode_per_seq_s * max(1, len(d.gen)))

    # ------------------------------------------------------------------ a shared host (CPU slots)

    def active_workers(self) -> int:
        """Workers wanting a core now: generating devices, the learner's devices, the host thread."""
        # a weight load in progress is CPU work too; a device paused for a whole step is not
        n = sum(1 for d in self.devs if d.gen and d.paused_until < math.inf)
        if self.learner_busy_until is not None:
            n += len(self.learner_devs)
        return n + (1 if self.host_cur is not None else 0)

    def update_speed(self) -> None:
        """Processor sharing on ``host_cpus`` cores: with ``a`` active workers each runs at
        ``min(1, host_cpus / a)`` of its own speed. Called after every event; a change re-times
        every device's next generation, the learner step and the host's current job."""
        if self.w.host_cpus <= 0:
            return
        new = min(1.0, self.w.host_cpus / max(1, self.active_workers()))
        if abs(new - self.speed) < 1e-12:
            return
        for d in self.devs:
            self.advance(d)
        self.learner_progress()
        self.host_progress()
        self.speed = new
        for d in self.devs:
            self.reschedule(d)
        self.schedule_learner()
        self.schedule_host()

    def learner_scale(self) -> float:
        return float(len(self.learner_devs)) ** self.w.train_alpha

    def learner_progress(self) -> None:
        """Bring the running step's remaining work to ``now``: its fixed part first, then its
        token work at ``n ** train_alpha`` device-speed on its ``n`` devices."""
        if self.learner_busy_until is not None:
            elapsed = (self.now - self.learner_t) * self.speed
            fixed = min(elapsed, self.learner_fixed)
            self.learner_fixed -= fixed
            self.learner_work -= (elapsed - fixed) * self.learner_scale()
            self.learner_t = self.now

    def schedule_learner(self) -> None:
        if self.learner_busy_until is not None:
            self.learner_stamp += 1
            left = self.learner_fixed + max(0.0, self.learner_work) / self.learner_scale()
            self.learner_busy_until = self.now + left / self.speed
            self.push(self.learner_busy_until, "step", 0, self.learner_stamp)

    def host_progress(self) -> None:
        if self.host_cur is not None:
            self.host_work -= (self.now - self.host_t) * self.speed
            self.host_t = self.now

    def schedule_host(self) -> None:
        if self.host_cur is not None:
            self.host_stamp += 1
            self.push(
                self.now + max(0.0, self.host_work) / self.speed, "host", self.host_cur, self.host_stamp
            )

    def host_next(self) -> None:
        """Start the host's next job (FIFO): the finishing work of one episode."""
        if self.host_cur is None and self.host_q:
            self.host_cur = self.host_q.popleft()
            self.host_work, self.host_t = self.w.host_episode_s, self.now
            self.schedule_host()

    def on_host_done(self) -> None:
        idx = self.host_cur
        assert idx is not None
        self.host_cur = None
        self.host_next()
        self.finish(self.eps[idx])

    def advance(self, d: _Dev) -> None:
        """Bring device ``d``'s virtual time to ``now``."""
        start = max(d.t, d.paused_until)
        if self.now > start and d.gen:
            d.vt += (self.now - start) * self.rate(d)
        d.t = self.now

    def reschedule(self, d: _Dev) -> None:
        d.stamp += 1
        if d.gen and d.paused_until < math.inf:
            start = max(self.now, d.paused_until)
            t = start + max(0.0, d.gen[0][0] - d.vt) / self.rate(d)
            self.push(t, "gen", d.i, d.stamp)

    def count(self, *states: str) -> int:
        return sum(1 for d in self.devs if d.state in states)

    def record(self) -> None:
        r, t = self.count(ROLLOUT), self.count(TRAIN)
        if not self.trace or self.trace[-1][1:] != (r, t):
            self.trace.append((self.now, r, t))

    # ------------------------------------------------------------------ episodes

    def admit_batches(self) -> None:
        while self.next_batch < self.w.steps and self.version >= self.next_batch - self.lag:
            k = self.next_batch
            if not self.w.overlap_batches and self.remaining.get(k - 1, 0) > 0:
                break  # the embedded runtime runs one batch at a time
            eps = make_episodes(self.w, k, self.seed)
            self.remaining[k] = len(eps)
            self.batch_tokens[k] = 0.0
            for e in eps:
                e.prefix = float(self.w.prompt_tokens)
                self.eps[e.index] = e
                self.queue.append(e.index)
            self.next_batch += 1
        self.fill()

    def has_room(self, d: _Dev, prefix: float) -> bool:
        """A slot free on ``d``, and (with ``kv_tokens``) room in its KV cache for ``prefix``."""
        if len(d.live) >= self.w.max_live:
            return False
        return self.w.kv_tokens <= 0 or d.kv + prefix <= self.w.kv_tokens or not d.live

    def target(self, prefix: float) -> _Dev | None:
        """The least-loaded admitting device with room for ``prefix`` (None: none has room)."""
        room = [d for d in self.devs if d.state == ROLLOUT and self.has_room(d, prefix)]
        return min(room, key=lambda x: (len(x.live), x.i)) if room else None

    def fill(self) -> None:
        """Give free slots to moved episodes first (they re-prefill their prefix), then to new ones."""
        for waiting in (self.resume, self.queue):
            while waiting:
                e = self.eps[waiting[0]]
                d = self.target(e.prefix)
                if d is None:
                    return
                waiting.popleft()
                self.place(e, d, e.prefix)

    def place(self, e: Episode, d: _Dev, prefill_tokens: float) -> None:
        e.device = d.i
        d.live.add(e.index)
        d.kv += e.prefix
        self.start_turn(e, prefill_tokens)

    def start_turn(self, e: Episode, prefill_tokens: float) -> None:
        d = self.devs[e.device]
        self.advance(d)
        tokens, _ = e.turns[e.turn]
        work = tokens + prefill_tokens / self.w.prefill_speedup
        heapq.heappush(d.gen, (d.vt + work, e.index))
        self.reschedule(d)

    def on_gen_done(self, d: _Dev) -> None:
        self.advance(d)
        while d.gen and d.gen[0][0] <= d.vt + 1e-9:
            _, idx = heapq.heappop(d.gen)
            e = self.eps[idx]
            tokens, latency = e.turns[e.turn]
            self.turns_run += 1
            e.prefix += tokens
            d.kv += tokens
            self.batch_tokens[e.batch] += tokens
            if e.turn == len(e.turns) - 1:
                if self.w.host_episode_s > 0:
                    self.host_q.append(idx)  # holds its slot until the host has recorded it
                    self.host_next()
                else:
                    self.finish(e)
            else:
                self.push(self.now + latency, "tool", idx)
        self.reschedule(d)

    def on_tool_done(self, idx: int) -> None:
        e = self.eps[idx]
        e.turn += 1
        e.prefix += self.w.obs_tokens
        self.batch_tokens[e.batch] += self.w.obs_tokens
        d = self.devs[e.device]
        d.kv += self.w.obs_tokens
        if d.state == DRAINING and not e.pinned:
            remaining = self.mean_turn_tokens * (len(e.turns) - e.turn)  # what the pool can estimate
            if self.migration.should_migrate(int(e.prefix), min(remaining, self.mean_turn_tokens)):
                d.live.discard(idx)
                d.kv -= e.prefix
                self.migrations += 1
                self.check_drained(d)
                target = self.target(e.prefix)
                if target is not None:
                    self.place(e, target, e.prefix)  # re-prefill it all
                else:
                    self.resume.append(idx)  # waits for the next free slot, ahead of new episodes
                return
            e.pinned = True
            self.in_place += 1
        self.start_turn(e, self.w.obs_tokens)

    def finish(self, e: Episode) -> None:
        d = self.devs[e.device]
        d.live.discard(e.index)
        d.kv -= e.prefix
        self.remaining[e.batch] -= 1
        self.finished_unconsumed += 1
        self.finished_total += 1
        del self.eps[e.index]
        self.check_drained(d)
        if not self.w.overlap_batches and self.remaining[e.batch] == 0:
            self.admit_batches()
        self.fill()
        self.maybe_train()

    # ------------------------------------------------------------------ learner

    def maybe_train(self) -> None:
        k = self.version
        if self.learner_busy_until is not None or k >= self.w.steps or self.remaining.get(k, 1) != 0:
            return
        if self.colocated:
            devs = list(self.devs)
            fixed = self.w.colocated_switch_s + self.w.train_fixed_s
        else:
            devs = [d for d in self.devs if d.state == TRAIN]
            if not devs:
                return
            fixed = self.w.train_fixed_s
        self.learner_devs = [d.i for d in devs]
        self.learner_busy_until = self.now
        self.learner_fixed, self.learner_work = fixed, self.train_work(k)
        self.learner_t = self.learner_start = self.now
        self.finished_unconsumed -= self.w.batch_size
        if self.sliced:  # every device trains: generation waits for the step's end
            for d in self.devs:
                self.advance(d)
                d.paused_until = math.inf
                self.reschedule(d)  # drops its pending generation event
        self.schedule_learner()

    def train_work(self, k: int) -> float:
        """Step ``k``'s token work in seconds on one device (it takes ``1 / n ** train_alpha`` of
        that on ``n``)."""
        w = self.w
        return (self.batch_tokens[k] + w.batch_size * w.prompt_tokens) / w.train_tokens_per_s

    def grow_step(self, d: _Dev) -> None:
        """Device ``d`` joined the train pool: the running step takes it from its next micro-batch on."""
        if self.w.grow_steps and self.learner_busy_until is not None and not self.colocated:
            self.learner_progress()
            self.learner_devs.append(d.i)
            self.schedule_learner()

    def on_step_done(self) -> None:
        self.learner_busy_s += self.now - self.learner_start
        self.last_step_s = self.now - self.learner_start
        self.version += 1
        self.learner_busy_until = None
        self.learner_devs = []
        if self.sliced:
            for d in self.devs:
                d.t = d.paused_until = self.now
                self.reschedule(d)
        if not self.colocated:
            for d in self.devs:
                if d.state in (ROLLOUT, DRAINING):
                    self.advance(d)
                    d.paused_until = max(d.paused_until, self.now) + self.w.weight_sync_s
                    self.reschedule(d)
                elif d.state == TRAIN and d.leave_after_step:
                    self.begin_join(d)
        self.admit_batches()
        self.maybe_train()

    # ------------------------------------------------------------------ moves

    def check_drained(self, d: _Dev) -> None:
        if d.state == DRAINING and not d.live:
            d.state = TO_TRAIN
            self.push(self.now + self.w.realloc_s, "joined_train", d.i)
            self.record()

    def begin_join(self, d: _Dev) -> None:
        d.leave_after_step = False
        d.state = TO_ROLLOUT
        self.push(self.now + self.w.realloc_s, "joined_rollout", d.i)
        self.record()

    def apply(self, to: str, count: int) -> None:
        self.moves += 1
        if to == "train":
            cands = sorted((d for d in self.devs if d.state == ROLLOUT), key=lambda x: (len(x.live), -x.i))
            for d in cands[:count]:
                d.state = DRAINING
                self.check_drained(d)
        else:
            cands = [d for d in self.devs if d.state == TRAIN and not d.leave_after_step]
            for d in cands[:count]:
                if d.i in self.learner_devs:
                    d.leave_after_step = True
                else:
                    self.begin_join(d)
        self.record()

    def telemetry(self) -> Telemetry:
        admitting = [d for d in self.devs if d.state == ROLLOUT]
        ahead = self.next_batch - 1 - self.version
        return Telemetry(
            time_s=self.now,
            rollout_devices=len(admitting),
            train_devices=self.count(TRAIN),
            moving=self.count(DRAINING, TO_TRAIN, TO_ROLLOUT) + sum(d.leave_after_step for d in self.devs),
            queue_depth=len(self.queue) + len(self.resume),
            unconsumed=self.finished_unconsumed,
            batch_size=self.w.batch_size,
            learner_idle_frac=self.window.learner_idle,
            long_tail_frac=self.window.long_tail,
            staleness=ahead / self.lag if self.lag else 1.0,
            last_step_s=self.last_step_s,
            finish_rate=self.window.finish_rate,
        )

    def observe_until(self, t: float) -> None:
        """Feed the state held during [now, t) to the telemetry window (only the controller reads it)."""
        dt = t - self.now
        if dt <= 0 or self.controller is None:
            return
        admitting = [d for d in self.devs if d.state == ROLLOUT]
        spare = spare_fraction(
            len(admitting),
            live=sum(len(d.live) for d in admitting),
            slots=self.w.max_live,
            generating=sum(len(d.gen) for d in admitting),
            saturation=self.saturation,
            kv_used=sum(d.kv for d in admitting),
            kv_tokens=self.w.kv_tokens,
        )
        waiting = self.learner_busy_until is None and self.count(TRAIN) > 0
        self.window.observe(
            dt, waiting, spare, len(self.queue) + len(self.resume), self.finished_total - self.finished_seen
        )
        self.finished_seen = self.finished_total

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        self.record()
        self.admit_batches()
        if self.controller is not None:
            self.push(self.w.tick_s, "tick")
        while self.version < self.w.steps:
            if not self.events:
                raise RuntimeError(f"simulation stalled at t={self.now:.1f}s (version {self.version})")
            t, _, kind, ident, stamp = heapq.heappop(self.events)
            self.observe_until(t)
            self.now = t
            if kind == "gen":
                d = self.devs[ident]
                if stamp == d.stamp:
                    self.on_gen_done(d)
            elif kind == "tool":
                self.on_tool_done(ident)
            elif kind == "step":
                if stamp == self.learner_stamp:
                    self.on_step_done()
            elif kind == "host":
                if stamp == self.host_stamp:
                    self.on_host_done()
            elif kind == "joined_train":
                d = self.devs[ident]
                d.state = TRAIN
                self.record()
                self.grow_step(d)
                self.maybe_train()
            elif kind == "joined_rollout":
                d = self.devs[ident]
                d.state = ROLLOUT
                d.t, d.vt = self.now, 0.0
                d.gen.clear()
                self.record()
                self.fill()
            elif kind == "tick":
                move = self.controller.decide(self.telemetry()) if self.controller else None
                if move is not None:
                    self.apply(move.to, move.count)
                    self.window.reset()
                self.push(self.now + self.w.tick_s, "tick")
            self.update_speed()
        self.record()
        traj = self.w.steps * self.w.batch_size
        return SimResult(
            policy=self.policy,
            devices=self.n,
            rollout_devices=None if self.colocated or self.controller else self.count(ROLLOUT),
            makespan_s=self.now,
            trajectories=traj,
            throughput=traj / self.now,
            learner_busy_frac=self.learner_busy_s / self.now,
            moves=self.moves,
            migrations=self.migrations,
            finished_in_place=self.in_place,
            turns=self.turns_run,
            tokens=sum(self.batch_tokens.values()),
            pool_trace=self.trace,
        )


# =========================================================================== the three policies


def simulate(
    w: Workload,
    n_devices: int,
    policy: str,
    *,
    rollout_devices: int | None = None,
    seed: int = 0,
    controller: ControllerConfig | None = None,
) -> SimResult:
    """Run one policy: ``colocated``, ``static`` (needs ``rollout_devices``), ``elastic`` or the
    reference ``colocated_async`` (see the module docstring)."""
    if n_devices < 2 and policy not in _WHOLE_CLUSTER:
        raise ValueError(f"--gpus: async policies need >= 2 devices, got {n_devices}")
    if policy in _WHOLE_CLUSTER:
        return _Sim(w, n_devices, policy, n_devices, seed, None, MigrationPolicy(w.prefill_speedup)).run()
    if rollout_devices is None or not 1 <= rollout_devices < n_devices:
        raise ValueError(f"rollout_devices must lie in [1, {n_devices - 1}], got {rollout_devices}")
    ctl = ElasticController(controller or default_controller(w)) if policy == "elastic" else None
    if policy not in ("static", "elastic"):
        raise ValueError(f"policy must be colocated, static, elastic or colocated_async, got {policy!r}")
    return _Sim(w, n_devices, policy, rollout_devices, seed, ctl, MigrationPolicy(w.prefill_speedup)).run()


def default_controller(w: Workload) -> ControllerConfig:
    """The elastic policy's controller: default thresholds, move cost = this workload's move cost.

    One move takes a device out of both pools for about ``realloc_s`` (drain + engine start or
    joining the training group) plus one weight load; the controller's hysteresis and gain check
    scale with that cost (see :class:`~trainer.elastic.controller.ElasticController`).
    """
    return ControllerConfig(move_cost_s=w.realloc_s + w.weight_sync_s)


def critical_path_bound(w: Workload, n_devices: int, seed: int = 0) -> float:
    """An upper bound on the throughput of *any* device policy (traj/s) under the staleness bound.

    Whatever the split and however devices move:

    * **Critical path.** (1) An episode cannot finish sooner than its own turns run back to back
      on a device serving it alone (``decode_base_s + decode_per_seq_s`` per token, its prefills,
      its tool latencies), (2) step ``k`` cannot start before every episode of batch ``k`` has
      finished and step ``k - 1`` is done, and it takes at least the training time on all
      ``n_devices``, and (3) batch ``k`` is admitted no earlier than step ``k - max_policy_lag - 1``
      is done.
    * **Work.** The run needs at least its rollout device-seconds plus its training
      device-seconds out of ``n_devices``: an episode holds one of a device's ``max_live`` slots
      (and, with ``kv_tokens``, its prefix in that device's KV cache) at least for its solo
      duration; a generated token costs at least ``decode_per_seq_s + decode_base_s / max_live``
      of a device; a step's token work takes at least its one-device time in device-seconds
      (``n ** (1 - train_alpha) >= 1`` on ``n`` devices).

    Weight sync and reallocation costs are left out, so the bound is optimistic. The larger of the
    two makespans bounds every policy's, elastic included; when it is close to the best static
    split's, no reallocation policy can beat static by much.
    """
    lag = w.max_policy_lag
    per_tok = w.decode_base_s + w.decode_per_seq_s
    done: list[float] = []
    slot_s = kv_s = decode_tokens = train_s = 0.0
    for k in range(w.steps):
        admit = done[k - lag - 1] if k - lag - 1 >= 0 else 0.0
        longest, tokens = 0.0, 0.0
        for e in make_episodes(w, k, seed):
            dur, prefill, prefix = 0.0, float(w.prompt_tokens), float(w.prompt_tokens)
            for i, (tok, lat) in enumerate(e.turns):
                turn = (tok + prefill / w.prefill_speedup) * per_tok + lat
                dur += turn
                prefix += tok
                kv_s += prefix * turn
                decode_tokens += tok
                tokens += tok + (w.obs_tokens if i < len(e.turns) - 1 else 0)
                prefill = float(w.obs_tokens)
                prefix += w.obs_tokens
            longest = max(longest, dur)
            slot_s += dur
        work = (tokens + w.batch_size * w.prompt_tokens) / w.train_tokens_per_s
        train_s += work
        train = w.train_fixed_s + work / n_devices**w.train_alpha
        start = max(admit + longest, done[-1] if done else 0.0)
        done.append(start + train)
    rollout_s = max(
        slot_s / w.max_live,
        kv_s / w.kv_tokens if w.kv_tokens > 0 else 0.0,
        decode_tokens * (w.decode_per_seq_s + w.decode_base_s / w.max_live),
    )
    makespan = max(done[-1], (rollout_s + train_s) / n_devices)
    return w.steps * w.batch_size / makespan


def best_static(
    w: Workload, n_devices: int, seed: int = 0, progress: Callable[[str], None] | None = None
) -> tuple[SimResult, dict[int, float]]:
    """The best static async split: a coarse grid over rollout sizes, refined around the best."""
    tried: dict[int, SimResult] = {}

    def at(r: int) -> SimResult:
        if r not in tried:
            tried[r] = simulate(w, n_devices, "static", rollout_devices=r, seed=seed)
            if progress:
                progress(
                    f"static split {r} rollout / {n_devices - r} train: {tried[r].throughput:.3f} traj/s"
                )
        return tried[r]

    step = max(1, (n_devices - 1) // 8)
    for r in range(1, n_devices, step):
        at(r)
    at(n_devices - 1)
    while step > 1:
        best = max(tried, key=lambda r: tried[r].throughput)
        step = max(1, step // 2)
        for r in (best - step, best + step):
            if 1 <= r < n_devices:
                at(r)
    best = max(tried, key=lambda r: tried[r].throughput)
    for r in (best - 1, best + 1):
        if 1 <= r < n_devices:
            at(r)
    best = max(tried, key=lambda r: tried[r].throughput)
    return tried[best], {r: res.throughput for r, res in sorted(tried.items())}


def compare(
    w: Workload,
    n_devices: int,
    seed: int = 0,
    controller: ControllerConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Colocated-sync vs the best static async split vs elastic (started from that split), with
    two yardsticks: the colocated-async reference policy and :func:`critical_path_bound`.

    ``progress`` (optional) is called with a line after each simulated run.
    """
    col = simulate(w, n_devices, "colocated", seed=seed)
    if progress:
        progress(f"colocated-sync: {col.throughput:.3f} traj/s")
    static, grid = best_static(w, n_devices, seed, progress)
    assert static.rollout_devices is not None
    ela = simulate(
        w, n_devices, "elastic", rollout_devices=static.rollout_devices, seed=seed, controller=controller
    )
    if progress:
        progress(
            f"elastic from {static.rollout_devices} rollout: {ela.throughput:.3f} traj/s ({ela.moves} moves)"
        )
    ref = simulate(w, n_devices, "colocated_async", seed=seed)
    if progress:
        progress(f"colocated-async (reference): {ref.throughput:.3f} traj/s")
    bound = critical_path_bound(w, n_devices, seed)
    return {
        "workload": w.name,
        "gpus": n_devices,
        "seed": seed,
        "throughput": {
            "colocated": col.throughput,
            "static_async": static.throughput,
            "elastic": ela.throughput,
        },
        "speedup_vs_colocated": ela.throughput / col.throughput,
        "speedup_vs_static_async": ela.throughput / static.throughput,
        "best_static_rollout_devices": static.rollout_devices,
        # the most any device policy could reach here (see critical_path_bound), as a speedup
        "bound_throughput": bound,
        "bound_vs_colocated": bound / col.throughput,
        "bound_vs_static_async": bound / static.throughput,
        # every device to every step and back at the colocated switch cost: what whole-cluster
        # reallocation reaches here (a reference, not a bound)
        "colocated_async_throughput": ref.throughput,
        "colocated_async_vs_static_async": ref.throughput / static.throughput,
        "static_grid": grid,
        "elastic": ela.summary(),
        "colocated": col.summary(),
        "static_async": static.summary(),
        "pool_trace": ela.pool_trace,
        "sources": list(w.sources),
    }


def iter_trace(trace: list[tuple[float, int, int]], end: float) -> Iterator[tuple[float, int, int]]:
    """Step-function points of a pool trace, for plotting."""
    for i, (t, r, k) in enumerate(trace):
        yield t, r, k
        nxt = trace[i + 1][0] if i + 1 < len(trace) else end
        yield nxt, r, k


def plot_pools(result: dict[str, Any], path: str) -> None:
    """Pool sizes over time of the elastic run (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = result["elastic"]["makespan_s"]
    pts = list(iter_trace(result["pool_trace"], end))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], label="rollout pool")
    ax.plot([p[0] for p in pts], [p[2] for p in pts], label="train pool")
    ax.axhline(result["best_static_rollout_devices"], ls=":", c="gray", label="best static rollout split")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("devices")
    ax.set_title(
        f"{result['workload']}, {result['gpus']} GPUs: elastic {result['speedup_vs_colocated']:.2f}x "
        f"colocated, {result['speedup_vs_static_async']:.2f}x best static"
    )
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_simulate(
    workload: str,
    gpus: int,
    *,
    as_json: bool = False,
    plot: str | None = None,
    seed: int = 0,
    steps: int | None = None,
) -> int:
    """The ``fr-agents simulate-elastic`` command."""
    import json

    from fr_agents.config import ConfigError

    try:
        w = get_workload(workload)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if gpus < 2:
        raise ConfigError(f"--gpus: need at least 2 devices, got {gpus}")
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps: must be >= 1, got {steps}")
        w = w.with_overrides(steps=steps)
    print(
        f"simulate-elastic: {w.name} on {gpus} GPUs, {w.steps} steps of {w.batch_size} (colocated, a "
        "search over static splits, elastic, the colocated-async reference; about a minute for xlong)",
        file=sys.stderr,
        flush=True,
    )
    res = compare(w, gpus, seed=seed, progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    if plot:
        plot_pools(res, plot)
    if as_json:
        print(json.dumps({k: v for k, v in res.items() if k != "pool_trace"}))
        return 0
    tp = res["throughput"]
    print(
        f"workload {w.name} on {gpus} GPUs ({w.steps} steps of {w.batch_size} trajectories): {w.description}"
    )
    print(f"  colocated-sync        {tp['colocated']:.3f} traj/s")
    print(
        f"  best static async     {tp['static_async']:.3f} traj/s  ({res['best_static_rollout_devices']} "
        f"rollout / {gpus - res['best_static_rollout_devices']} train)"
    )
    e = res["elastic"]
    print(
        f"  elastic               {tp['elastic']:.3f} traj/s  ({e['moves']} moves, "
        f"{e['migrations']} episodes re-prefilled, {e['finished_in_place']} finished in place)"
    )
    print(
        f"  speedup vs colocated {res['speedup_vs_colocated']:.2f}x, vs best "
        f"static async {res['speedup_vs_static_async']:.2f}x"
    )
    print(
        f"  upper bound for any device policy (critical path): {res['bound_throughput']:.3f} traj/s = "
        f"{res['bound_vs_colocated']:.2f}x colocated, {res['bound_vs_static_async']:.2f}x best static async"
    )
    print(
        "  reference, colocated-async (the whole cluster to every step and "
        f"back): {res['colocated_async_throughput']:.3f} traj/s = "
        f"{res['colocated_async_vs_static_async']:.2f}x best static async"
    )
    if plot:
        print(f"  pool plot: {plot}")
    return 0
