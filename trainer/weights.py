"""The weight board: published policy versions, held until rollout no longer needs them.

A learner-side part (:func:`trainer.parts.build_learner_side`). The learner publishes version
``k + 1`` after step ``k``; the rollout side waits here for the version its next batch samples
with (the admission rule of bounded staleness) and loads it into its engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class TrainingStopped(Exception):
    """Raised inside the rollout thread when the run is stopping."""


class WeightBoard:
    """Published policy versions (CPU copies) that rollout may still need; versions wait here."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._weights: dict[int, dict[str, torch.Tensor]] = {}
        self._listeners: list[Callable[..., None]] = []
        self.stopped = False

    def publish(self, version: int, model_or_sd: Any, *, copy: bool = True) -> None:
        """Hold ``version`` (a model's or a state dict's CPU copy; ``copy=False``: the given CPU
        tensors themselves, for a receiver that already holds its own)."""
        sd = model_or_sd.state_dict() if hasattr(model_or_sd, "state_dict") else model_or_sd
        held = {k: v.detach().to("cpu", copy=copy) for k, v in sd.items()}
        with self._cond:
            self._weights[version] = held
            self._cond.notify_all()
        self._tell("publish", version, held)

    def add_listener(self, fn: Callable[..., None]) -> None:
        """Call ``fn(event, version, weights)`` on every ``publish`` (weights given), ``drop_below``
        and ``stop`` (weights None) from now on; the versions held now are replayed to it first, in
        order. The rollout process is fed this way (:mod:`trainer.rollout_process`)."""
        with self._cond:
            held = sorted(self._weights.items())
            self._listeners.append(fn)
        for version, weights in held:
            fn("publish", version, weights)

    def wait_for(self, version: int, timeout: float | None = None) -> dict[str, torch.Tensor]:
        """Block until ``version`` is published (the admission rule); raises when stopping."""
        with self._cond:
            ok = self._cond.wait_for(lambda: version in self._weights or self.stopped, timeout)
            if self.stopped:
                raise TrainingStopped()
            if not ok:
                raise TimeoutError(f"policy version {version} was not published in time")
            return self._weights[version]

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        with self._cond:
            return self._weights.get(version)

    def drop_below(self, version: int) -> None:
        with self._cond:
            for v in [v for v in self._weights if v < version]:
                del self._weights[v]
        self._tell("drop", version, None)

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()
        self._tell("stop", None, None)

    def _tell(self, event: str, version: int | None, weights: dict[str, torch.Tensor] | None) -> None:
        with self._cond:
            listeners = list(self._listeners)
        for fn in listeners:
            fn(event, version, weights)
