"""Periodic evaluation during training: avg@k on a configured bench every N optimizer steps.

The training loop owns the schedule; this module owns the measurement. With the config fields
``trainer.eval_every`` (N), ``trainer.eval_k`` (k), ``trainer.eval_temperature``,
``trainer.eval_episodes`` (problems per evaluation) and ``trainer.eval_bench`` (a bench name, or
empty for the config's own held-out split), the loop does::

    bench_for = load_object(cfg.trainer.eval_bench_provider, key=...)   # "envs.benches:eval_bench_for"
    periodic = PeriodicEval.from_config(cfg, run_dir, bench_for(cfg))      # None when eval_k == 0
    ...
    if periodic is not None and periodic.due(step):
        row = periodic.run(step, model, tokenizer)      # {"step", "bench", "mean@k", "pass@1", ...}
        metrics.event("eval_at_k", **row)

Each evaluation samples k completions per problem with the learner's current weights (an
:class:`~fr_agents.policy.hf.HFEngine` over the live model, restored to its training mode after),
through the same rollout and env as training, with the same seeds at every step, so successive
points differ only by the weights. Samples land in ``RUN_DIR/evals/samples/step_<N>/`` and one
summary line per evaluation in ``RUN_DIR/evals/during_training.jsonl``; a resumed run re-uses
the samples of steps already evaluated.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fr_agents.config import TrainConfig
from fr_agents.eval.bench import Bench
from fr_agents.eval.runner import BenchResult, EvalSettings, run_bench
from fr_agents.run_layout import DURING_TRAINING_FILE, EVALS_DIR

log = logging.getLogger(__name__)


def evaluate_live(
    model: Any,
    tokenizer: Any,
    bench: Bench,
    settings: EvalSettings,
    *,
    label: str,
    out_dir: str | Path,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
) -> BenchResult:
    """:func:`~fr_agents.eval.runner.run_bench` with the current weights of ``model`` (an
    :class:`~fr_agents.policy.hf.HFEngine` over the live model, not a copy, unless ``settings.dtype``
    asks for a copy in another dtype, as ``rollout.dtype`` does), in eval mode; the
    model's training mode is restored after. Training's held-out and periodic evaluations both
    come through here, so they mean what ``fr-agents eval`` means. ``on_sample``: as
    :func:`~fr_agents.eval.runner.run_bench_async`'s (progress)."""
    import torch

    from fr_agents.policy.hf import HFEngine

    was_training = model.training
    model.eval()
    sampler = model
    if settings.dtype is not None and next(model.parameters()).dtype != getattr(torch, settings.dtype):
        sampler = copy.deepcopy(model).to(
            getattr(torch, settings.dtype)
        )  # rollout.dtype: sample as the rollout does
    engine = HFEngine(
        sampler, tokenizer, max_batch_size=settings.concurrency, seed=settings.seed, compact=settings.compact
    )
    try:
        return run_bench(
            engine, tokenizer, bench, settings, label=label, out_dir=out_dir, on_sample=on_sample
        )
    finally:
        engine.close_sync()
        model.train(was_training)


class PeriodicEval:
    """avg@k of the live policy on ``bench`` every ``every`` steps (see the module docstring)."""

    def __init__(
        self,
        bench: Bench,
        out_dir: str | Path,
        *,
        every: int,
        k: int,
        temperature: float = 1.0,
        seed: int = 0,
        concurrency: int = 64,
        compact: bool = True,
        dtype: str | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"trainer.eval_every: must be >= 1 for periodic evaluation, got {every}")
        self.bench = bench
        self.out_dir = Path(out_dir)
        self.every = every
        self.settings = EvalSettings(
            k=k, temperature=temperature, seed=seed, concurrency=concurrency, compact=compact, dtype=dtype
        )
        self.history: list[dict[str, Any]] = []

    @classmethod
    def from_config(cls, cfg: TrainConfig, run_dir: str | Path, bench: Bench) -> PeriodicEval | None:
        """The evaluator a config asks for, or None (``trainer.eval_k == 0`` or ``eval_every == 0``)."""
        t = cfg.trainer
        if t.eval_k <= 0 or t.eval_every <= 0:
            return None
        limit = t.eval_episodes if t.eval_episodes > 0 else None
        return cls(
            bench.subset(limit, cfg.tasks.seed) if limit else bench,
            Path(run_dir) / EVALS_DIR,
            every=t.eval_every,
            k=t.eval_k,
            temperature=t.eval_temperature,
            seed=t.seed,
            concurrency=max(1, cfg.rollout.concurrency),
            compact=cfg.model.compact_forward,
            dtype=cfg.engine_dtype,
        )

    def due(self, step: int) -> bool:
        """Whether step ``step`` (optimizer steps taken) is an evaluation step."""
        return step > 0 and step % self.every == 0

    def run(self, step: int, model: Any, tokenizer: Any) -> dict[str, Any]:
        """Evaluate ``model`` now; returns (and appends to ``during_training.jsonl``) the summary row."""
        res = evaluate_live(
            model, tokenizer, self.bench, self.settings, label=f"step_{step:06d}", out_dir=self.out_dir
        )
        row = {
            "step": step,
            "bench": self.bench.name,
            "k": self.settings.k,
            "tasks": res.tasks,
            "seconds": round(res.seconds, 3),
            **{f"avg@{self.settings.k}" if m == "mean@k" else m: v for m, v in res.metrics.items()},
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / DURING_TRAINING_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.history.append(row)
        log.info(
            "eval step %d on %s: avg@%d %.1f%% (%d problems, %.1fs)",
            step,
            self.bench.name,
            self.settings.k,
            100 * res.metrics["mean@k"],
            res.tasks,
            res.seconds,
        )
        return row
