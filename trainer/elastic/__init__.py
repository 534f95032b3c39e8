"""Elastic training: devices move between a rollout pool and a train pool while a run goes on.

Everything elastic lives here, in four parts:

* :mod:`~trainer.elastic.controller` -- the policy: telemetry in, moves out (pure, no devices);
* :mod:`~trainer.elastic.pools` -- :class:`ElasticPool`, an engine over several device engines
  that drains and joins devices without dropping an episode;
* :mod:`~trainer.elastic.runtime` -- :class:`ElasticHooks`, the hooks that give a plain
  :class:`~trainer.loop.Trainer` an elastic pool as its engine and size the learner to its pool
  (``Trainer(cfg, run_dir, hooks=[ElasticHooks(cfg, devices=3, rollout=2)])``;
  ``fr-agents train PRESET trainer.elastic=true``);
* :mod:`~trainer.elastic.simulator` -- a discrete-event model of the same policy on a cluster
  (``fr-agents simulate-elastic``), calibrated by ``benchmarks/elastic_validation.py``.

The runtime imports torch and the training loop; the controller and the simulator do not, so
``ElasticHooks`` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.elastic.runtime import ElasticHooks

__all__ = ["ElasticHooks"]


def __getattr__(name: str) -> Any:
    if name == "ElasticHooks":
        from trainer.elastic.runtime import ElasticHooks

        return ElasticHooks
    raise AttributeError(f"module 'trainer.elastic' has no attribute {name!r}")
