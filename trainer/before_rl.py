"""A new run's set-up before RL: the held-out figures before, the warm start, the figures after.

A resumed run skips this (its checkpoint holds the evaluations it made); the two evaluations are
``before`` and ``after_warm_start`` in ``metrics.jsonl`` and in the run's result.
"""

from __future__ import annotations

from pathlib import Path

from fr_agents.config import TrainConfig
from trainer.checkpoint import TrainerState
from trainer.held_out import evaluate_held_out
from trainer.os_tuning import release_freed_memory, warm_start_cores
from trainer.parts import LearnerSide, RolloutSide


def before_rl(
    cfg: TrainConfig, learner: LearnerSide, rollout: RolloutSide, state: TrainerState, run_dir: Path
) -> dict[str, dict[str, float]]:
    """Evaluate held out (``before``, unless ``trainer.eval_before`` is false), warm start on ``warm_start.examples`` demos (every core
    this process may use: nothing runs beside it), evaluate again (``after_warm_start``). Returns
    the evaluations, also kept in ``state.extra["evals"]`` for the checkpoint."""
    from trainer.warm_start import run_warm_start

    evals: dict[str, dict[str, float]] = {}
    if cfg.trainer.eval_before and (ev := evaluate_held_out(learner, "before", 0)):
        evals["before"] = ev
    if cfg.warm_start.examples > 0:
        with warm_start_cores():  # supervised steps with nothing beside them
            run_warm_start(cfg, learner.model, rollout.runner, rollout.demo_tasks, learner.metrics, state, run_dir)
        release_freed_memory()
        if ev := evaluate_held_out(learner, "after_warm_start", 0):
            evals["after_warm_start"] = ev
    state.extra["evals"] = evals
    return evals
