"""The weight board: published policy versions, held until rollout no longer needs them.

A learner-side part (:func:`trainer.parts.build_learner_side`). The learner publishes version
``k + 1`` after step ``k``; the rollout side waits here for the version its next batch samples
with (the admission rule of bounded staleness) and loads it into its engine.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import torch


class TrainingStopped(Exception):
    """Raised inside the rollout thread when the run is stopping."""


class FlatWeights:
    """A state dict held as one contiguous CPU buffer per dtype, the tensors being views into it.

    What a published version is made of. Handing one to another process moves a buffer per dtype
    (torch shares each one's memory once) instead of a tensor per parameter: for a small model the
    per-tensor hand-off (a shared-memory file and a descriptor each) cost more than the copy.
    """

    def __init__(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` (any devices) into the buffers."""
        sizes: dict[torch.dtype, int] = {}
        self.layout: list[tuple[str, torch.dtype, int, tuple[int, ...]]] = []
        for name, t in state_dict.items():
            offset = sizes.get(t.dtype, 0)
            self.layout.append((name, t.dtype, offset, tuple(t.shape)))
            sizes[t.dtype] = offset + t.numel()
        self.buffers = {dtype: torch.empty(n, dtype=dtype) for dtype, n in sizes.items()}
        self._views = self._make_views()
        with torch.no_grad():
            for name, t in state_dict.items():
                self._views[name].copy_(t.detach())

    def tensors(self) -> dict[str, torch.Tensor]:
        """The state dict: views into the buffers, in the original order."""
        return self._views

    def _make_views(self) -> dict[str, torch.Tensor]:
        return {
            name: self.buffers[dtype][offset : offset + math.prod(shape)].view(shape)
            for name, dtype, offset, shape in self.layout
        }

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "buffers": self.buffers}  # the views are rebuilt on arrival

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.layout, self.buffers = state["layout"], state["buffers"]
        self._views = self._make_views()


class WeightBoard:
    """Published policy versions (CPU copies) that rollout may still need; versions wait here."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._weights: dict[int, FlatWeights | dict[str, torch.Tensor]] = {}
        self._listeners: list[Callable[..., None]] = []
        self.stopped = False

    def publish(
        self,
        version: int,
        weights: torch.nn.Module | dict[str, torch.Tensor] | FlatWeights,
        *,
        copy: bool = True,
    ) -> None:
        """Hold ``version``: a model's or a state dict's CPU copy (one :class:`FlatWeights`), or with
        ``copy=False`` the given CPU tensors (a state dict or a :class:`FlatWeights`) themselves, for
        a receiver that already holds its own."""
        if copy:
            held: FlatWeights | dict[str, torch.Tensor] = FlatWeights(
                weights.state_dict() if hasattr(weights, "state_dict") else weights
            )
        elif isinstance(weights, FlatWeights):
            held = weights
        else:
            held = {k: v.detach().to("cpu", copy=False) for k, v in weights.items()}
        with self._cond:
            self._weights[version] = held
            self._cond.notify_all()
        self._tell("publish", version, held)

    def add_listener(self, fn: Callable[..., None]) -> None:
        """Call ``fn(event, version, weights)`` on every ``publish`` (weights given: a
        :class:`FlatWeights`, or the state dict given with ``copy=False``), ``drop_below``
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
            return _state_dict(self._weights[version])

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        with self._cond:
            held = self._weights.get(version)
        return None if held is None else _state_dict(held)

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

    def _tell(
        self, event: str, version: int | None, weights: FlatWeights | dict[str, torch.Tensor] | None
    ) -> None:
        with self._cond:
            listeners = list(self._listeners)
        for fn in listeners:
            fn(event, version, weights)


def _state_dict(held: FlatWeights | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return held.tensors() if isinstance(held, FlatWeights) else held
