"""Elastic training: devices move between a rollout pool and a train pool while a run goes on.

Everything elastic lives here, in four parts:

* :mod:`~trainer.elastic.controller` -- the policy: telemetry in, moves out (pure, no devices);
* :mod:`~trainer.elastic.pools` -- :class:`ElasticPool`, an engine over several device engines
  that drains and joins devices without dropping an episode;
* :mod:`~trainer.elastic.runtime` -- :class:`ElasticTrainer`, the embedded training loop with an
  elastic pool as its engine and step hooks that size the learner to its pool
  (``fr-agents train PRESET trainer.elastic=true``);
* :mod:`~trainer.elastic.simulator` -- a discrete-event model of the same policy on a cluster
  (``fr-agents simulate-elastic``), calibrated by ``benchmarks/elastic_validation.py``.

The runtime imports torch and the training loop; the controller and the simulator do not, so
``ElasticTrainer`` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.elastic.runtime import ElasticTrainer

__all__ = ["ElasticTrainer"]


def __getattr__(name: str) -> Any:
    if name == "ElasticTrainer":
        from trainer.elastic.runtime import ElasticTrainer

        return ElasticTrainer
    raise AttributeError(f"module 'trainer.elastic' has no attribute {name!r}")
