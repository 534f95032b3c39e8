"""``fr-agents eval``'s work: every checkpoint on every bench, then one report.

The command parses its flags and resolves the benches; this module runs them::

    results = evaluate_checkpoints(["tiny", "runs/x/checkpoints/step_000100"], ["base", "rl"], benches,
                                   settings, out_dir="/tmp/eval", engine="hf")
    print(report(results, "/tmp/eval"))

Each (checkpoint, bench) pair goes through :func:`fr_agents.eval.runner.run_bench_async` with a
progress bar on a terminal, else a log line per tenth of its samples (:class:`LogProgress`); an
expert (``--agent expert``) plays instead of a model with :func:`evaluate_expert`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fr_agents.config import ConfigError
from fr_agents.eval.runner import EvalSettings, LogProgress, run_bench_async

log = logging.getLogger(__name__)


def eval_labels(checkpoints: Sequence[str], given: Sequence[str]) -> list[str]:
    """Report names: ``given`` (one per checkpoint), else short names from the paths, made unique."""
    if given and len(given) != len(checkpoints):
        raise ConfigError(f"--label: given {len(given)} times for {len(checkpoints)} checkpoints")
    labels = list(given) or [
        "/".join(Path(c).parts[-3::2]) if Path(c).name.startswith("step_") else (Path(c).name or c)
        for c in checkpoints
    ]
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _run(
    engine: Any, tokenizer: Any, bench: Any, settings: EvalSettings, label: str, out_dir: str, **kw: Any
) -> Any:
    from rich.progress import Progress

    name, total = f"{label} · {bench.name}", len(bench.items) * settings.k

    def run(on_sample: Any) -> Any:
        return asyncio.run(
            run_bench_async(
                engine, tokenizer, bench, settings, label=label, out_dir=out_dir, on_sample=on_sample, **kw
            )
        )

    if sys.stderr.isatty():
        with Progress(transient=True) as bar:
            task = bar.add_task(name, total=total)
            res = run(lambda row: bar.advance(task))
    else:
        res = run(LogProgress(name, total).advance)
    log.info("%s on %s: %s", label, bench.name, {m: round(v, 4) for m, v in res.metrics.items()})
    return res


def evaluate_checkpoints(
    checkpoints: Sequence[str],
    labels: Sequence[str],
    benches: Sequence[Any],
    settings: EvalSettings,
    *,
    out_dir: str,
    engine: str = "hf",
    **engine_kwargs: Any,
) -> list[Any]:
    """Every checkpoint (opened with :func:`fr_agents.eval.engines.open_engine`) on every bench."""
    from fr_agents.eval.engines import open_engine

    results = []
    for ckpt, label in zip(checkpoints, labels, strict=True):
        opened = open_engine(
            engine, ckpt, seed=settings.seed, max_batch_size=settings.concurrency, **engine_kwargs
        )
        try:
            results += [_run(opened.engine, opened.tokenizer, b, settings, label, out_dir) for b in benches]
        finally:
            opened.close()
    return results


def evaluate_expert(
    benches: Sequence[Any], settings: EvalSettings, *, out_dir: str, tokenizer: Any
) -> list[Any]:
    """Each bench played by its env's expert (``expert_action()``), reported as checkpoint 'expert'."""
    import gymnasium

    from fr_agents.rollout import expert_actor, require_expert

    results = []
    for bench in benches:
        require_expert(lambda b=bench: gymnasium.make(b.env_id, **b.env_kwargs), bench.env_id)
        results.append(_run(None, tokenizer, bench, settings, "expert", out_dir, actor=expert_actor))
    return results


def report(results: Sequence[Any], out_dir: str) -> str:
    """Write results.md/json/png into ``out_dir``; returns the markdown table and the paths."""
    from fr_agents.eval.report import render_markdown, write_report

    paths = write_report(list(results), out_dir)
    return f"{render_markdown(list(results))}\nreport: {paths['markdown']}  {paths['json']}  {paths['plot']}"
