"""Elastic device pools: every device is either rolling out or training, and devices move.

The policy that decides the moves lives in :mod:`trainer.elastic.controller`; this module holds

* :class:`ElasticPool` -- an :class:`~fr_agents.policy.base.Engine` that routes each episode's
  requests to one rollout device's engine and moves devices between pools without dropping a
  live episode:

  - leaving the rollout pool, a device first stops admitting new episodes (``DRAINING``); each of
    its live episodes then either continues on another rollout engine -- its next request carries
    the episode's full stored prefix (the tokens held in the tree, token for token), which the new
    engine prefills; when no engine has a free slot the request waits for one, ahead of new
    episodes -- or finishes in place when that is cheaper (:class:`MigrationPolicy`). A
    generation already running on the device always completes there. When the last live episode
    has left, the device is in the train pool.
  - joining the rollout pool, a device loads the current weights first, then admits episodes.

An episode is the asyncio task that calls :meth:`ElasticPool.generate` (the training loop and
:func:`fr_agents.rollout.run_episodes` run one task per episode), so no caller changes are needed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fr_agents.policy.base import Engine, Generation, SamplingOptions
from trainer.elastic.controller import MigrationPolicy, spare_fraction

log = logging.getLogger(__name__)


# =========================================================================== the runtime pool


class DeviceState(enum.Enum):
    ROLLOUT = "rollout"  # admits and serves episodes
    DRAINING = "draining"  # leaving rollout: serves its live episodes, admits none
    TRAIN = "train"  # in the train pool
    JOINING = "joining"  # loading weights before admitting


@dataclass
class Device:
    """One accelerator (a CPU slot here) and its rollout engine."""

    name: str
    engine: Engine | None
    state: DeviceState
    live: set[Hashable] = field(default_factory=set)
    inflight: int = 0
    drained: threading.Event = field(default_factory=threading.Event)


@dataclass
class PoolStats:
    admitted: int = 0
    finished: int = 0
    migrated: int = 0
    finished_in_place: int = 0
    reprefill_tokens: int = 0
    moves_to_train: int = 0
    moves_to_rollout: int = 0


class ElasticPool(Engine):
    """Routes episodes to rollout devices; moves devices between pools without dropping episodes.

    ``devices`` maps a device name to its engine; ``rollout`` names the devices that start in the
    rollout pool (the rest start in the train pool). ``max_live`` caps the live episodes of one
    device (its KV memory); an episode waits for admission while every rollout device is full --
    those waiting episodes are the rollout queue depth. ``saturation`` (default ``max_live``) is the
    number of concurrent generations that keeps one device's compute busy (telemetry only).
    """

    def __init__(
        self,
        devices: dict[str, Engine],
        rollout: Sequence[str],
        *,
        max_live: int = 64,
        saturation: int | None = None,
        migration: MigrationPolicy | None = None,
        on_moved: Callable[[str, DeviceState], None] | None = None,
    ) -> None:
        unknown = [d for d in rollout if d not in devices]
        if unknown:
            raise ValueError(f"rollout: unknown devices {unknown}")
        if max_live < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        self.devices = {
            n: Device(n, e, DeviceState.ROLLOUT if n in rollout else DeviceState.TRAIN)
            for n, e in devices.items()
        }
        self.max_live = max_live
        self.saturation = saturation or max_live
        self.migration = migration or MigrationPolicy()
        self.on_moved = on_moved
        self.stats = PoolStats()
        self._lock = threading.RLock()
        self._where: dict[Hashable, str] = {}  # episode -> device
        self._pinned: set[Hashable] = set()  # episodes finishing in place on a draining device
        self._resuming: set[Hashable] = set()  # live episodes moved off a draining device, waiting for a slot
        self._calls: dict[Hashable, int] = {}
        self._tokens: dict[Hashable, int] = {}
        self._waiting = 0
        self._weights: tuple[dict[str, Any], int] | None = None
        self.version = 0

    # ------------------------------------------------------------------ views

    def in_state(self, *states: DeviceState) -> list[str]:
        with self._lock:
            return [n for n, d in self.devices.items() if d.state in states]

    def live_counts(self) -> dict[str, int]:
        with self._lock:
            return {n: len(d.live) for n, d in self.devices.items()}

    @property
    def queue_depth(self) -> int:
        return self._waiting

    def idle_capacity_frac(self) -> float:
        """Spare share of the admitting rollout pool: :func:`spare_fraction` of its devices, their
        live episodes (``max_live`` slots each) and running generations (``saturation`` each)."""
        with self._lock:
            admitting = [d for d in self.devices.values() if d.state is DeviceState.ROLLOUT]
            return spare_fraction(
                len(admitting),
                live=sum(len(d.live) for d in admitting),
                slots=self.max_live,
                generating=sum(d.inflight for d in admitting),
                saturation=self.saturation,
            )

    # ------------------------------------------------------------------ weights

    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Publish weights to every device serving episodes; joiners load the latest first."""
        with self._lock:
            self._weights = (state_dict, int(version))
            self.version = int(version)
            serving = [
                d for d in self.devices.values() if d.state in (DeviceState.ROLLOUT, DeviceState.DRAINING)
            ]
        for d in serving:
            assert d.engine is not None
            d.engine.set_weights(state_dict, version)

    # ------------------------------------------------------------------ moves

    def move_to_train(self, name: str) -> threading.Event:
        """Stop admitting on ``name``; the returned event is set once its live episodes are gone."""
        with self._lock:
            d = self.devices[name]
            if d.state is not DeviceState.ROLLOUT:
                raise ValueError(f"device {name} is {d.state.value}, not rollout")
            d.state = DeviceState.DRAINING
            d.drained.clear()
            self.stats.moves_to_train += 1
            log.info("device %s draining (%d live episodes)", name, len(d.live))
            self._maybe_drained(d)
        return d.drained

    def move_to_rollout(self, name: str) -> None:
        """Load the current weights on ``name`` (blocking), then let it admit episodes."""
        with self._lock:
            d = self.devices[name]
            if d.state is not DeviceState.TRAIN:
                raise ValueError(f"device {name} is {d.state.value}, not train")
            d.state = DeviceState.JOINING
            weights = self._weights
        assert d.engine is not None
        if weights is not None:
            d.engine.set_weights(*weights)
        with self._lock:
            if self._weights is not None and self._weights is not weights:
                d.engine.set_weights(*self._weights)  # a newer version was published meanwhile
            d.state = DeviceState.ROLLOUT
            self.stats.moves_to_rollout += 1
        log.info("device %s joined rollout at version %d", name, self.version)
        if self.on_moved:
            self.on_moved(name, DeviceState.ROLLOUT)

    def _maybe_drained(self, d: Device) -> None:
        if d.state is DeviceState.DRAINING and not d.live and d.inflight == 0:
            d.state = DeviceState.TRAIN
            d.drained.set()
            log.info("device %s left rollout", d.name)
            if self.on_moved:
                self.on_moved(d.name, DeviceState.TRAIN)

    # ------------------------------------------------------------------ routing

    def _admit(self, key: Hashable, *, resuming: bool = False) -> str | None:
        if self._resuming and not resuming:
            return None  # moved episodes get the free slots first
        admitting = [
            d for d in self.devices.values() if d.state is DeviceState.ROLLOUT and len(d.live) < self.max_live
        ]
        if not admitting:
            return None
        d = min(admitting, key=lambda x: (len(x.live), x.name))
        d.live.add(key)
        self._where[key] = d.name
        return d.name

    def _episode_done(self, key: Hashable) -> None:
        with self._lock:
            name = self._where.pop(key, None)
            self._pinned.discard(key)
            self._resuming.discard(key)
            self._calls.pop(key, None)
            self._tokens.pop(key, None)
            self.stats.finished += 1
            if name is not None:
                d = self.devices[name]
                d.live.discard(key)
                self._maybe_drained(d)

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ElasticPool.generate must run inside an asyncio task (one task per episode)")
        key = task
        name = await self._route(key, prompt_ids, options)
        d = self.devices[name]
        assert d.engine is not None
        try:
            gen = await d.engine.generate(prompt_ids, options)
        finally:
            with self._lock:
                d.inflight -= 1
                self._maybe_drained(d)
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
            self._tokens[key] = self._tokens.get(key, 0) + len(gen.token_ids)
        return gen

    async def _route(self, key: Hashable, prompt_ids: Sequence[int], options: SamplingOptions) -> str:
        waited = False
        try:
            while True:
                with self._lock:
                    name = self._where.get(key)
                    if name is None and key in self._resuming:
                        name = self._admit(key, resuming=True)
                        if name is not None:
                            self._resuming.discard(key)
                    elif name is None:
                        name = self._admit(key)
                        if name is not None:
                            self.stats.admitted += 1
                            asyncio.current_task().add_done_callback(lambda _t, k=key: self._episode_done(k))  # type: ignore[union-attr]
                    elif self.devices[name].state is DeviceState.DRAINING and key not in self._pinned:
                        name = self._migrate_or_pin(key, name, len(prompt_ids), options)
                    if name is not None:
                        self.devices[name].inflight += 1
                        return name
                    if not waited:
                        waited = True
                        self._waiting += 1
                await asyncio.sleep(0.002)
        finally:
            if waited:
                with self._lock:
                    self._waiting -= 1

    def _migrate_or_pin(self, key: Hashable, name: str, prefix: int, options: SamplingOptions) -> str | None:
        """A live episode of draining ``name`` asks for its next turn: move it, or keep it here."""
        calls = self._calls.get(key, 0)
        per_turn = self._tokens.get(key, 0) / calls if calls else options.max_tokens
        old = self.devices[name]
        if not self.migration.should_migrate(prefix, per_turn):
            self._pinned.add(key)
            self.stats.finished_in_place += 1
            return name
        old.live.discard(key)
        del self._where[key]
        self.stats.migrated += 1
        self.stats.reprefill_tokens += prefix
        new = self._admit(key, resuming=True)
        if new is None:  # no free slot anywhere: wait for the first one, ahead of new episodes
            self._resuming.add(key)
            log.debug("episode left %s, waiting for a slot to re-prefill %d tokens", name, prefix)
        else:
            log.debug("episode moved %s -> %s, re-prefilling %d tokens", name, new, prefix)
        self._maybe_drained(old)
        return new

    async def close(self) -> None:
        for d in self.devices.values():
            if d.engine is not None:
                await d.engine.close()

    def close_sync(self) -> None:
        """Close every device's engine from synchronous code."""
        for d in self.devices.values():
            close = getattr(d.engine, "close_sync", None)
            if close is not None:
                close()
