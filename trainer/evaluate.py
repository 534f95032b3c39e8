"""Held-out evaluation in training: the runner of ``fr-agents eval``, greedy, on the held-out bench.

The policy is sampled as the rollout samples it: through a copy in ``rollout.dtype`` when that
names another dtype than the learner's (``TrainConfig.engine_dtype``).

Before RL, after the warm start, every ``trainer.eval_every`` steps and after RL, the loop calls
:meth:`HeldOutEval.run`. It plays ``trainer.eval_episodes`` problems of the bench that
``trainer.eval_bench_provider`` returns for the config (default: the config's own held-out split,
``tasks.test_split``, on its own env) with one greedy reply per turn (the evaluations every
``eval_every`` steps play only the first ``trainer.eval_during_episodes`` of them, when set), through
:func:`fr_agents.eval.periodic.evaluate_live` — the same rollout (``run_episode``), env class and
chat template as training and as ``fr-agents eval`` — so single-turn, multi-turn, tool and sandbox
envs are all measured the same way. It reports the success rate (``info['won']``, else reward > 0),
the mean reward, and the mean turns and tool calls per episode; the samples land in
``RUN_DIR/evals/samples/<name>_step<N>/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fr_agents.config import TrainConfig
from fr_agents.defaults import HELD_OUT_TEMPERATURE
from fr_agents.eval.bench import Bench
from fr_agents.eval.periodic import evaluate_live
from fr_agents.eval.runner import EvalSettings, LogProgress
from fr_agents.run_layout import EVALS_DIR

if TYPE_CHECKING:
    from trainer.types import PolicyModel, Tokenizer


class HeldOutEval:
    """Greedy held-out figures of the live policy (see the module docstring)."""

    def __init__(
        self,
        bench: Bench,
        out_dir: str | Path,
        *,
        seed: int = 0,
        concurrency: int = 32,
        compact: bool = True,
        dtype: str | None = None,
        during_episodes: int = 0,
    ) -> None:
        self.bench = bench
        # the evaluations every eval_every steps: the first during_episodes of the sample (0: all)
        self.during = bench.limited(during_episodes) if 0 < during_episodes < len(bench.items) else bench
        self.out_dir = Path(out_dir)
        self.settings = EvalSettings(
            k=1,
            temperature=HELD_OUT_TEMPERATURE,
            seed=seed,
            concurrency=max(1, concurrency),
            compact=compact,
            dtype=dtype,
        )

    @classmethod
    def from_config(cls, cfg: TrainConfig, run_dir: str | Path, bench: Bench) -> HeldOutEval | None:
        """The evaluator of ``cfg`` on ``bench`` (``eval_episodes`` of its problems, a fixed seeded
        sample), or None when ``trainer.eval_episodes`` is 0."""
        n = cfg.trainer.eval_episodes
        if n <= 0:
            return None
        return cls(
            bench.subset(n, cfg.tasks.seed),
            Path(run_dir) / EVALS_DIR,
            seed=cfg.trainer.seed,
            concurrency=cfg.rollout.concurrency,
            compact=cfg.model.compact_forward,
            dtype=cfg.engine_dtype,
            during_episodes=cfg.trainer.eval_during_episodes,
        )

    def run(
        self,
        name: str,
        step: int,
        model: PolicyModel,
        tokenizer: Tokenizer,
        *,
        during: bool = False,
    ) -> dict[str, float]:
        """Evaluate ``model`` now: ``{success, reward, turns, tool_calls, episodes, seconds}``, plus
        ``by_group`` (per task type: tasks, success, mean reward, turns) when the bench's problems
        have groups (ALFWorld). ``during``: an evaluation every ``eval_every`` steps, on the first
        ``trainer.eval_during_episodes`` problems of the sample."""
        bench = self.during if during else self.bench
        res = evaluate_live(
            model,
            tokenizer,
            bench,
            self.settings,
            label=f"{name}_step{step:06d}",
            out_dir=self.out_dir,
            on_sample=LogProgress(f"held-out {name}", len(bench.items), parts=4).advance,
        )
        per_episode = res.extra["per_episode"]
        figures = {
            "success": res.metrics["success"],
            "reward": res.metrics["mean@k"],
            "turns": per_episode["turns"],
            "tool_calls": per_episode["tool_calls"],
            "episodes": res.tasks,
            "seconds": res.seconds,
        }
        if by_group := res.extra.get("by_group"):
            figures["by_group"] = {
                g: {
                    "tasks": int(m["tasks"]),
                    "success": m["success"],
                    "reward": m["mean@k"],
                    "turns": m["turns"],
                }
                for g, m in by_group.items()
            }
        return figures
