"""The elastic policy: telemetry in, moves out; shared by the runtime and the simulator.

* :class:`Telemetry` + :class:`TelemetryWindow` -- what the policy reads: the rollout queue depth
  (admissible episodes waiting for a rollout slot), finished-but-unconsumed trajectories, the
  learner's idle fraction, the rollout long-tail fraction (the share of the rollout pool that is
  spare -- :func:`spare_fraction` -- while no episode waits), staleness (how far rollout runs
  ahead of the learner, 1.0 = at the bound), the last learner step's duration and the recent
  rate at which episodes finish (the last two size a move's expected gain).
* :class:`ElasticController` -- a pure policy: ``decide(telemetry) -> Move | None``. It never
  touches a device; the runtime (:class:`~trainer.elastic.pools.ElasticPool` driven by
  :mod:`trainer.elastic.runtime`) and :mod:`trainer.elastic.simulator` apply its moves with their
  own mechanics.
* :class:`MigrationPolicy` -- whether a draining device's live episode moves or finishes in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# =========================================================================== telemetry + policy


@dataclass(frozen=True)
class Telemetry:
    """One observation of the system, as the controller sees it."""

    time_s: float
    rollout_devices: int
    train_devices: int
    moving: int  # devices draining or loading weights (in neither pool yet)
    queue_depth: int  # admissible episodes waiting for a rollout slot
    unconsumed: int  # finished trajectories the learner has not consumed yet
    batch_size: int
    learner_idle_frac: float  # recent fraction of time the learner waited for data
    long_tail_frac: float  # recent share of the rollout pool that was spare while nothing waited
    staleness: float  # rollout's lead over the learner / max_policy_lag (1.0 = at the bound)
    last_step_s: float = 0.0  # wall seconds of the learner's last step (0: no step yet)
    finish_rate: float = 0.0  # recent episodes finished per second (0: none seen yet)


@dataclass(frozen=True)
class Move:
    """Move ``count`` devices into pool ``to``."""

    to: Literal["rollout", "train"]
    count: int
    reason: str


@dataclass(frozen=True)
class ControllerConfig:
    """Thresholds of :class:`ElasticController` (fractions are of recent wall time/capacity).

    ``move_cost_s`` is what one move costs the moved device: draining/reallocating plus loading
    weights (the simulator passes its workload's ``realloc_s + weight_sync_s``; the runtime its
    measured weight-load time). It sets the controller's hysteresis: after a move no decision is
    made for ``hold_factor * move_cost_s`` (a move must have a chance to pay for itself before it
    is judged), and a move is made only when its expected gain over that horizon exceeds its cost.
    With ``move_cost_s = 0`` (the default) both checks are off.
    """

    min_rollout: int = 1
    min_train: int = 1
    idle_high: float = 0.2  # learner idle fraction that calls for more rollout devices
    tail_high: float = 0.25  # spare share of the rollout pool that calls for lending devices to training
    cooldown_s: float = 0.0  # no decision this soon after the previous move
    max_move_frac: float = 0.5  # one decision moves at most this share of a pool (at least 1)
    move_cost_s: float = 0.0  # seconds one move takes a device out of both pools
    hold_factor: float = 2.0  # hysteresis: hold a new split for hold_factor * move_cost_s

    def __post_init__(self) -> None:
        if self.min_rollout < 1 or self.min_train < 1:
            raise ValueError("min_rollout and min_train must be >= 1")
        for name in ("idle_high", "tail_high", "max_move_frac"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in (0, 1), got {getattr(self, name)}")
        for name in ("cooldown_s", "move_cost_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.hold_factor < 1.0:
            raise ValueError(f"hold_factor must be >= 1, got {self.hold_factor}")

    @property
    def hold_s(self) -> float:
        """No decision this soon after a move: ``max(cooldown_s, hold_factor * move_cost_s)``."""
        return max(self.cooldown_s, self.hold_factor * self.move_cost_s)


class ElasticController:
    """Decides device moves from telemetry; the same object drives the simulator and the runtime.

    Four rules, each moving a share of a pool proportional to the waste it sees:

    * **learner starved, rollout backlogged** -- the learner idled a fraction ``f >= idle_high`` of
      the recent window, fewer than a batch of trajectories is waiting, and more rollout devices
      would actually produce trajectories faster: episodes wait for a slot (queue depth > 0) or
      the rollout pool had almost nothing to spare (spare share ``< tail_high / 2``). A
      latency-bound rollout (devices idle, every episode waiting on its own next token or tool
      call) is not helped by more devices, so the rule does not fire there. Moves
      ``round(f * train)`` (at least 1) devices to rollout.
    * **rollout in its long tail** -- a share ``g >= tail_high`` of the rollout pool was spare
      with nothing waiting to start: every live episode would still have a slot, and every
      running generation its compute, on the other ``(1 - g)`` of the devices. That is the
      stragglers of a batch, or admission blocked by the staleness bound -- and it is exactly when
      the learner waits for those stragglers and then trains. Lend ``floor(g * rollout)`` (at
      least 1) spare devices to training, whether the learner is busy or waiting: its next step
      runs on more devices. Their live stragglers move by re-prefill or finish in place
      (:class:`MigrationPolicy`); the devices come back when the next batch is admitted and the
      pool fills again (below).
    * **learner is the bottleneck** -- the learner is busy, rollout sits at the staleness bound
      (it may admit nothing more until the learner steps) and its backlog would drain sooner
      (``queue_depth / finish_rate``) than a learner step takes (``last_step_s``): lend it
      ``max_move_frac`` of the rollout pool.
    * **back home** -- the rollout pool is below the split the run started with and is busy
      again (a queue, or almost nothing spare): the lent devices return (after the running step).

    **Cost.** A move takes each moved device out of both pools for ``move_cost_s``. A move to
    rollout is expected to shorten the backlog -- ``queue_depth / finish_rate`` seconds of work at
    the recent rate -- by ``n / (rollout + n)`` of it; with no backlog estimate, to recover about
    ``H * f * n / (rollout + n)`` seconds of learner waiting over the hold horizon
    ``H = hold_factor * move_cost_s``. A lend to training is expected to
    shorten the next learner step by ``last_step_s * n / (train + n)`` (linear scaling, an
    optimistic guess; before the first step, ``H * (1 - f) * n / (train + n)``); a lend must pay
    for its way there and back, ``2 * move_cost_s``. After a move no decision is made for ``H``
    (hysteresis), so a split is never reversed before it could have paid off.

    One decision moves at most ``max_move_frac`` of a pool, so a noisy window cannot empty it.
    Pools never shrink below ``min_rollout`` / ``min_train``; no move is made while another is
    still in progress. The only state is the time of the last move and the starting split (the
    rollout pool's size at the first decision, or ``home_rollout``), so the same telemetry
    sequence always gives the same decisions.
    """

    def __init__(self, config: ControllerConfig | None = None, home_rollout: int = -1) -> None:
        self.config = config or ControllerConfig()
        self.last_move_s = -float("inf")
        self.home_rollout = home_rollout  # -1: the rollout pool's size at the first decision

    def _pays(self, gain_frac: float, n: int, pool_after: int) -> bool:
        c = self.config
        if c.move_cost_s <= 0:
            return True
        horizon = c.hold_factor * c.move_cost_s
        return horizon * gain_frac * n / pool_after > c.move_cost_s

    def _feed_pays(self, t: Telemetry, n: int) -> bool:
        c = self.config
        if c.move_cost_s <= 0:
            return True
        if t.queue_depth > 0 and t.finish_rate > 0:
            backlog_s = t.queue_depth / t.finish_rate  # the queue drains at the recent finish rate
            return backlog_s * n / (t.rollout_devices + n) > c.move_cost_s
        return self._pays(t.learner_idle_frac, n, t.rollout_devices + n)

    def _lend_pays(self, t: Telemetry, n: int) -> bool:
        c = self.config
        if c.move_cost_s <= 0:
            return True
        if t.last_step_s <= 0:
            return self._pays(1.0 - t.learner_idle_frac, n, t.train_devices + n)
        return t.last_step_s * n / (t.train_devices + n) > 2 * c.move_cost_s

    def decide(self, t: Telemetry) -> Move | None:
        c = self.config
        if self.home_rollout < 0:
            self.home_rollout = t.rollout_devices
        if t.moving or t.time_s - self.last_move_s < c.hold_s:
            return None
        move: Move | None = None
        f = t.learner_idle_frac
        starved = f >= c.idle_high and t.unconsumed < t.batch_size
        backlogged = t.queue_depth > 0 or t.long_tail_frac < c.tail_high / 2
        if starved and backlogged and t.train_devices > c.min_train:
            n = max(1, round(f * t.train_devices))
            n = min(n, max(1, int(c.max_move_frac * t.train_devices)), t.train_devices - c.min_train)
            if self._feed_pays(t, n):
                move = Move("rollout", n, f"learner idle {f:.0%}, queue {t.queue_depth}")
        elif t.long_tail_frac >= c.tail_high and t.queue_depth == 0 and t.rollout_devices > c.min_rollout:
            n = max(1, math.floor(t.long_tail_frac * t.rollout_devices + 1e-9))
            n = min(n, max(1, int(c.max_move_frac * t.rollout_devices)), t.rollout_devices - c.min_rollout)
            if self._lend_pays(t, n):
                move = Move(
                    "train", n, f"rollout pool {t.long_tail_frac:.0%} spare, staleness {t.staleness:.2f}"
                )
        elif (
            f < c.idle_high
            and t.staleness >= 1.0
            and t.queue_depth > 0
            and t.finish_rate > 0
            and t.last_step_s > t.queue_depth / t.finish_rate
            and t.rollout_devices > c.min_rollout
        ):
            n = min(max(1, int(c.max_move_frac * t.rollout_devices)), t.rollout_devices - c.min_rollout)
            if self._lend_pays(t, n):
                move = Move(
                    "train",
                    n,
                    f"learner is the bottleneck: step {t.last_step_s:.0f}s > "
                    f"backlog {t.queue_depth / t.finish_rate:.0f}s",
                )
        elif backlogged and t.rollout_devices < self.home_rollout and t.train_devices > c.min_train:
            n = min(self.home_rollout - t.rollout_devices, t.train_devices - c.min_train)
            move = Move(
                "rollout", n, f"rollout busy again (queue {t.queue_depth}): back to the starting split"
            )
        if move is not None:
            self.last_move_s = t.time_s
        return move


def spare_fraction(
    devices: int,
    *,
    live: int,
    slots: int,
    generating: int,
    saturation: float,
    kv_used: float = 0.0,
    kv_tokens: float = 0.0,
) -> float:
    """Share of ``devices`` rollout devices (whole devices) that could leave while every live
    episode keeps a slot (``slots`` per device), every running generation its compute
    (``saturation`` concurrent generations keep one device busy) and, with ``kv_tokens > 0``,
    every held token its KV cache.

    This is the rollout pool's "long tail" measure: near 0 while the pool is full or busy, near 1
    when a few stragglers (or nothing) hold it. Runtime and simulator both use it.
    """
    if devices <= 0:
        return 0.0
    need = max(live / slots, generating / saturation, kv_used / kv_tokens if kv_tokens > 0 else 0.0)
    return min(1.0, max(0.0, 1.0 - math.ceil(need - 1e-9) / devices))


class TelemetryWindow:
    """Exponential moving averages of the learner idle and rollout long-tail fractions, and of
    the rate at which episodes finish.

    ``observe(dt, learner_waiting, idle_capacity_frac, queue_depth, finished)`` accumulates ``dt``
    seconds of state (``finished``: episodes that ended during them); the averages decay with
    time constant ``tau_s``. Used by both runtime and simulator.
    """

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self.learner_idle = 0.0
        self.long_tail = 0.0
        self.finish_rate = 0.0

    def observe(
        self, dt: float, learner_waiting: bool, idle_capacity_frac: float, queue_depth: int, finished: int = 0
    ) -> None:
        if dt <= 0:
            return
        self.finish_rate = self.finish_rate * math.exp(-dt / self.tau_s) + finished / self.tau_s
        a = 1.0 - math.exp(-dt / self.tau_s)
        self.learner_idle += a * ((1.0 if learner_waiting else 0.0) - self.learner_idle)
        tail = idle_capacity_frac if queue_depth == 0 else 0.0
        # rises slowly, falls at once: a pool counts as spare only while it has stayed spare (a
        # newly admitted batch fills it in an instant, and the stale average must not lend it out)
        self.long_tail = min(tail, self.long_tail + a * (tail - self.long_tail))

    def reset(self) -> None:
        """Forget the fractions (after a move they describe another split); the finish rate is
        kept -- it changes slowly and a move is judged by it."""
        self.learner_idle = 0.0
        self.long_tail = 0.0


@dataclass(frozen=True)
class MigrationPolicy:
    """Migrate a draining device's live episode, or let it finish in place?

    Re-prefilling a prefix of ``P`` tokens on another engine costs about ``P / prefill_speedup``
    decode-token times (prefill processes a prompt in parallel, decode one token per step);
    keeping the episode holds the leaving device for the episode's remaining decode tokens.
    Migrate when the first is cheaper.
    """

    prefill_speedup: float = 8.0

    def should_migrate(self, prefix_tokens: int, expected_remaining_tokens: float) -> bool:
        return prefix_tokens / self.prefill_speedup < expected_remaining_tokens
