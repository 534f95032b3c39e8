"""Held-out evaluations during a run: run one, log it as an ``eval`` event and a log line."""

from __future__ import annotations

import logging
from pathlib import Path

from trainer.checkpoint import load_weights
from trainer.parts import LearnerSide

log = logging.getLogger(__name__)


def evaluate_held_out(
    side: LearnerSide, name: str, step: int, *, during: bool = False, **extra: int,
) -> dict[str, float] | None:
    """Greedy held-out figures of ``side``'s model now (:class:`~trainer.evaluate.HeldOutEval`; ``during``:
    one of the evaluations every ``trainer.eval_every`` steps, on ``trainer.eval_during_episodes``
    of the problems), logged as an ``eval`` event with ``extra`` fields; None when
    ``trainer.eval_episodes`` is 0."""
    if side.held_out is None:
        return None
    res = {**side.held_out.run(name, step, side.model, side.tokenizer, during=during), **extra}
    side.metrics.event("eval", **res, name=name, step=step)
    log.info(
        "held-out %s (step %d): success %.1f%%, reward %.3f, %.1f turns, %.1f tool calls (%d episodes, %.1fs)",
        name, step, 100 * res["success"], res["reward"], res["turns"], res["tool_calls"], res["episodes"], res["seconds"],
    )
    if by_group := res.get("by_group"):
        log.info("held-out %s by group: %s", name, ", ".join(
            f"{g} {100 * m['success']:.0f}% of {m['tasks']}" for g, m in by_group.items()))
    return res


def evaluate_kept(side: LearnerSide, checkpoint: Path, stopped_at: int, reason: str) -> dict[str, float] | None:
    """A run stopped by a guard (a non-finite loss, the collapse guard) hands back its last good
    ``checkpoint``, not the weights it stopped with at step ``stopped_at``: those are loaded into
    ``side.model`` and evaluated as ``after_rl`` (the event's ``step`` is the checkpoint's,
    ``checkpoint_step`` says so), so a stopped run still reports where RL left the model it keeps.
    None when nothing is evaluated held out."""
    if side.held_out is None:
        return None
    step = int(checkpoint.name.removeprefix("step_"))
    log.warning("the run stopped at step %d (%s); its result is the last good checkpoint %s: evaluating that",
                stopped_at, reason, checkpoint)
    load_weights(checkpoint, side.model)
    return evaluate_held_out(side, "after_rl", step, checkpoint_step=step)
