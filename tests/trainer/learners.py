"""Tests build a Learner as the trainer does: from its four config objects (never loose keywords).

``make_learner(model, lr=1e-2, delta=0.05)`` puts each switch into the config that declares it
(:class:`~fr_agents.objective_config.ObjectiveConfig`, :class:`~fr_agents.config.OptimConfig`,
:class:`~trainer.learner.Chunking`, :class:`~fr_agents.models.forward.ForwardConfig`) and hands the
four to :class:`~trainer.learner.Learner`, whose own configs reject a bad value by its name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fr_agents.config import OptimConfig
from fr_agents.models.forward import ForwardConfig
from fr_agents.objective_config import ObjectiveConfig
from trainer.learner import Chunking, Learner

CONFIGS = (
    ("objective", ObjectiveConfig),
    ("optim", OptimConfig),
    ("chunking", Chunking),
    ("forward", ForwardConfig),
)


def learner_configs(**switches: Any) -> dict[str, Any]:
    """``{objective, optim, chunking, forward}``: the default configs with ``switches`` set where declared."""
    configs = {}
    for name, cls in CONFIGS:
        declared = {f.name for f in dataclasses.fields(cls)}
        configs[name] = cls(**{k: switches.pop(k) for k in list(switches) if k in declared})
    if switches:
        raise TypeError(f"no learner config declares {sorted(switches)}")
    return configs


def make_learner(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, **switches: Any
) -> Learner:
    """A :class:`Learner` of ``model`` from the configs ``switches`` set (see the module docstring)."""
    own = {k: switches.pop(k) for k in ("scheduler", "version", "before_micro_batch") if k in switches}
    return Learner(model, optimizer, **learner_configs(**switches), **own)
