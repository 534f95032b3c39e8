"""Evaluation: checkpoints on benches, pass@k and mean@k, reports and plots.

* :mod:`.metrics` — the unbiased pass@k estimator, mean@k (avg@k).
* :mod:`.bench` — :class:`Bench` / :class:`BenchItem`, what a benchmark is to the runner (the
  named benches are defined in ``envs/benches.py``).
* :mod:`.runner` — :func:`run_bench`: k seeded samples per problem through the rollout, per-sample
  JSONL, resumable.
* :mod:`.report` — the comparison table (markdown + JSON) and plot across checkpoints.
* :mod:`.engines` — :func:`open_engine` for ``hf`` / ``vllm`` / ``openai``.
* :mod:`.periodic` — :class:`PeriodicEval`, avg@k every N training steps.
"""

from fr_agents.eval.bench import Bench, BenchItem
from fr_agents.eval.metrics import mean_at_k, mean_pass_at_k, pass_at_k
from fr_agents.eval.runner import BenchResult, EvalSettings, EvalSettingsMismatch, run_bench, run_bench_async

__all__ = [
    "Bench",
    "BenchItem",
    "BenchResult",
    "EvalSettings",
    "EvalSettingsMismatch",
    "mean_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "run_bench",
    "run_bench_async",
]
