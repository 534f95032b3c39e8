"""Policy tokens per second in the training loop, where a user sees them.

``benchmarks/rollout.py`` measures the rollout alone. In ``fr-agents train`` the rollout shares the
machine with the learner, and at ``rollout.max_policy_lag`` 1 it can run at most one batch ahead of
the learner's step, so the figure a user sees is the loop's: policy tokens sampled per second of
RL. This script runs ``fr-agents train PRESET`` once per variant, one after another in fresh
processes (held-out evaluations off: it measures the loop, not learning), and prints per variant:

* **tokens/s**: policy tokens sampled per second over the steps after the first ``--skip`` (model
  load, the first batch and the first weight push are not the steady state);
* **step s**: the learner's median step time (forward, backward, optimizer) over the same steps;
* **cores busy**: CPU seconds of the whole process tree per wall second of the whole command;
* the load average before and after, since any other process on the cores slows every figure;
* **ceiling**: the most tokens/s this machine could give that loop, were every core doing nothing but
  the step's matrix products at their peak (see :func:`ceiling`), and the share of it the run reached.

A variant is a name, ``key=value`` overrides of the preset, and optionally ``@DIR``: a checkout whose
code runs it (a ``git worktree`` of an older commit), so a change is measured against its parent in
one run on one machine::

    git worktree add /tmp/before HEAD~1
    python benchmarks/loop_speed.py --preset math-smollm2 --minutes 4 \\
        --variant before @/tmp/before --variant now \\
        --variant now-2-threads trainer.threads=2 trainer.pin_cpus=false

Each variant's run directory is kept under ``--out`` (metrics.jsonl, the log).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_variant(words: list[str]) -> tuple[str, list[str], Path]:
    """``NAME [key=value ...] [@DIR]`` -> (name, overrides, code dir)."""
    name, rest = words[0], words[1:]
    code = [w[1:] for w in rest if w.startswith("@")]
    if len(code) > 1:
        raise SystemExit(f"--variant {name}: one @DIR at most, got {code}")
    bad = [w for w in rest if not w.startswith("@") and "=" not in w]
    if bad:
        raise SystemExit(f"--variant {name}: {bad[0]!r} is neither key=value nor @DIR")
    where = Path(code[0]).resolve() if code else REPO
    if not (where / "fr_agents" / "cli.py").is_file():
        raise SystemExit(f"--variant {name}: {where} is not a checkout of this project (no fr_agents/cli.py)")
    return name, [w for w in rest if not w.startswith("@")], where


def run(preset: str, overrides: list[str], code: Path, run_dir: Path, minutes: float) -> tuple[float, float]:
    """``fr-agents train`` from ``code``; returns (wall seconds, CPU seconds of the process tree)."""
    cmd = [
        sys.executable,
        "-m",
        "fr_agents.cli",
        "train",
        preset,
        f"trainer.max_minutes={minutes}",
        "trainer.steps=1000000",
        "trainer.eval_episodes=0",
        "trainer.eval_every=0",
        "trainer.plateau_patience=0",
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    env = {**os.environ, "PYTHONPATH": str(code), "FR_AGENTS_LOG": os.environ.get("FR_AGENTS_LOG", "WARNING")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        proc = subprocess.run(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"training failed ({' '.join(cmd)}); log: {run_dir.with_suffix('.log')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def steady(run_dir: Path, skip: int) -> dict[str, Any]:
    """Tokens/s and the median learner step over the steps after the first ``skip``."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("kind") == "step"]
    if len(steps) <= skip + 1:
        raise SystemExit(f"{run_dir}: {len(steps)} steps, too few past --skip {skip}; give it more --minutes")
    first, used = steps[skip], steps[skip + 1 :]
    tokens = sum(r.get("sampled_tokens", r["tokens"]) for r in used)
    seconds = used[-1]["elapsed_s"] - first["elapsed_s"]
    return {
        "steps": len(steps),
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "tokens_per_step": tokens / len(used),
        "step_s": statistics.median(r["step_seconds"] for r in used),
    }


def model_products(model_name: str) -> dict[str, int]:
    """The parameters of ``model_name``'s matrix products, read from its config (no weights loaded):
    ``body``, the decoder layers' linear maps, which every token the model runs goes through;
    ``head``, the output head, run only where logits are read; and the products' widths."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fr_agents.models.resolve import resolve_model

    hf = AutoConfig.from_pretrained(resolve_model(model_name))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    out = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not out)
    return {"body": body, "head": out.weight.numel(), "hidden": hf.hidden_size, "mlp": hf.intermediate_size}


@functools.cache
def _precision_script() -> ModuleType:
    """``benchmarks/precision.py``, loaded once: its timer of matrix products."""
    spec = importlib.util.spec_from_file_location(
        "precision_benchmark", Path(__file__).with_name("precision.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _product_gflops(rows: int, k: int, n: int, dtype: str, repeat: int) -> float:
    """One core's best GFLOP/s for ``rows x k @ k x n`` in ``dtype`` (``benchmarks/precision.py``'s timer)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _precision_script().gflops(rows, k, n, getattr(torch, dtype), repeat)
    finally:
        torch.set_num_threads(threads)


def ceiling(run_dir: Path, skip: int, cores: int, repeat: int = 3) -> dict[str, Any]:
    """The most policy tokens/s the run's loop could reach on this machine, and what bounds it.

    From the run's own steps after the first ``skip``: the learner ran ``forward_tokens`` through the
    body and read logits at ``policy_tokens``; the rollout sampled ``sampled_tokens``. A product of
    ``p`` parameters costs 2p FLOP a token forward and 4p backward (the input's gradient and the
    weight's), so the learner's step is ~6 (body x forward + head x policy) FLOP and the rollout's
    ~2 (body x forward + head x sampled): the engine runs the same prompts and replies once (the
    shared opening counted once, as the learner does). Attention, sampling, grading and all Python
    are left out, so the real bound is lower. Each side's products are timed on one core at their
    peak in the run's dtypes (the learner's chunk at 1,024 rows; the engine's decode step at
    ``rollout.concurrency`` rows, its best case), and all ``cores`` are taken to run them:

        ceiling = sampled tokens / ((learner FLOP / learner peak + rollout FLOP / rollout peak) / cores)

    ``no_weight_grad_ceiling`` is the same with a learner that computes no weight gradients (4 instead
    of 6: what training only small adapters, e.g. LoRA, at best saves). Empty when the run's steps do
    not log the counts (a checkout older than them)."""
    from fr_agents.config import load_config

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    used = [r for r in rows if r.get("kind") == "step"][skip + 1 :]
    if not used or any("forward_tokens" not in r or "policy_tokens" not in r for r in used):
        return {}
    cfg = load_config(str(run_dir / "config.yaml"))
    forward = sum(r["forward_tokens"] for r in used)
    policy = sum(r["policy_tokens"] for r in used)
    sampled = sum(r.get("sampled_tokens", r["tokens"]) for r in used)
    m = model_products(cfg.model.name)
    learner_dtype, engine_dtype = cfg.learner_autocast or "float32", cfg.engine_dtype
    learner_peak = _product_gflops(1024, m["hidden"], m["mlp"], learner_dtype, repeat) * 1e9
    engine_peak = _product_gflops(cfg.rollout.concurrency, m["hidden"], m["mlp"], engine_dtype, repeat) * 1e9
    pass_flop = m["body"] * forward + m["head"] * policy  # one forward pass of the learner's tokens
    rollout_flop = 2 * (m["body"] * forward + m["head"] * sampled)

    def bound(learner_factor: int) -> float:
        cpu_s = learner_factor * pass_flop / learner_peak + rollout_flop / engine_peak
        return sampled / (cpu_s / cores)

    return {
        "gflop_per_token": (6 * pass_flop + rollout_flop) / sampled / 1e9,
        "learner_share": 6 * pass_flop / (6 * pass_flop + rollout_flop),
        "learner_peak_gflops": learner_peak / 1e9,
        "engine_peak_gflops": engine_peak / 1e9,
        "learner_dtype": learner_dtype,
        "engine_dtype": engine_dtype,
        "ceiling": bound(6),
        "no_weight_grad_ceiling": bound(4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--preset", default="math-smollm2", help="preset every variant trains (default math-smollm2)"
    )
    ap.add_argument(
        "--variant",
        nargs="+",
        action="append",
        required=True,
        metavar="WORD",
        help="NAME [key=value ...] [@DIR] (repeatable): overrides, and a checkout to run from",
    )
    ap.add_argument("--minutes", type=float, default=4.0, help="minutes of RL per variant (default 4)")
    ap.add_argument("--skip", type=int, default=3, help="first steps left out of the figures (default 3)")
    ap.add_argument("--out", default=None, help="folder for the runs (default a new temp dir)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variant]
    if len({v[0] for v in variants}) != len(variants):
        raise SystemExit("--variant: names must differ")
    out = Path(a.out or tempfile.mkdtemp(prefix="loop_speed-"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"# policy tokens/s in `fr-agents train {a.preset}`'s loop, {a.minutes} min of RL per variant, "
        f"first {a.skip} steps left out; {len(os.sched_getaffinity(0))} cores; runs in {out}",
        flush=True,
    )
    results = []
    for name, overrides, code in variants:
        load0 = os.getloadavg()
        wall, cpu = run(a.preset, overrides, code, out / name, a.minutes)
        fig = steady(out / name, a.skip)
        load1 = os.getloadavg()
        bound = ceiling(out / name, a.skip, len(os.sched_getaffinity(0)))
        fig.update(bound or {"ceiling": float("nan")})
        fig.update(
            name=name,
            overrides=overrides,
            code=str(code),
            wall_s=wall,
            cores_busy=cpu / wall,
            load_before=load0[0],
            load_after=load1[0],
        )
        results.append(fig)
        print(
            f"{name}: {fig['tokens_per_s']:.1f} tokens/s, {fig['tokens_per_step']:.0f} tokens "
            f"a step, learner step {fig['step_s']:.2f} s (median), {fig['steps']} steps, "
            f"cores busy {fig['cores_busy']:.2f}, load {load0[0]:.2f} -> {load1[0]:.2f}",
            flush=True,
        )
        if not bound:
            print("  no ceiling: this run's steps do not log forward_tokens and policy_tokens", flush=True)
            continue
        print(
            f"  ceiling {fig['ceiling']:.1f} tokens/s ({fig['tokens_per_s'] / fig['ceiling']:.0%} reached): "
            f"{fig['gflop_per_token']:.2f} GFLOP of products a sampled token ({fig['learner_share']:.0%} the "
            f"learner's), one core's peak {fig['learner_peak_gflops']:.1f} GFLOP/s ({fig['learner_dtype']}, "
            f"learner) / {fig['engine_peak_gflops']:.1f} ({fig['engine_dtype']}, engine); without weight "
            f"gradients {fig['no_weight_grad_ceiling']:.1f}",
            flush=True,
        )
    print(
        "\n| variant | code | overrides | tokens/s | ceiling | learner step s "
        "| cores busy | load before -> after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for f in results:
        print(
            f"| {f['name']} | {f['code']} | {' '.join(f['overrides']) or '-'} | {f['tokens_per_s']:.1f} | "
            f"{f['ceiling']:.1f} | {f['step_s']:.2f} | {f['cores_busy']:.2f} | "
            f"{f['load_before']:.2f} -> {f['load_after']:.2f} |"
        )
    base = results[0]["tokens_per_s"]
    for f in results[1:]:
        print(f"{f['name']} / {results[0]['name']}: {f['tokens_per_s'] / base:.2f}x tokens/s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
