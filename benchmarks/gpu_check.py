"""A few real training steps of a preset on one device, and what they cost: the GPU path's check.

``python benchmarks/gpu_check.py [--device cuda|cpu] [--preset math-tiny] [--steps 5]
[--engine auto|hf|vllm] [--warm-start 32] [--eval-episodes 16] [--run-dir DIR] [key=value ...]``

It runs ``fr-agents train`` in this process (the same path as the command: config, preflight, run
directory, :func:`trainer.loop.run_training`) with the preset's own recipe, changed only where a
short check needs it:

* ``trainer.device``: ``--device`` (cuda by default; without a visible CUDA device the script stops
  at once and says to pass ``--device cpu``). The learner and the rollout engine both run there.
* ``model.dtype``: bfloat16 on a CUDA device that supports it (float32 otherwise, and on the CPU the
  preset's own). In bfloat16 the compact forward (``model.compact_forward``, float32 only) steps aside
  for transformers' forward; the run's log says so.
* ``rollout.engine``: ``--engine``; ``auto`` picks vllm when it is importable and the device is CUDA,
  else hf (transformers).
* ``trainer.steps`` = ``--steps``, with no time budget, plateau stop or collapse guard (a check of a
  few steps must run them all); checkpoints only at the start and the end of RL.
* a short supervised warm start (``--warm-start`` demos, one epoch; 0 or a preset whose tasks come
  from the env's own reset: none) and a small held-out evaluation before and after
  (``--eval-episodes``), so the warm start and the evaluator run on the device too.

Any ``key=value`` after the flags is applied last (``model.tiny_size=nano trainer.batch_size=8``).

It prints, as plain lines and then as one JSON line (the last line of its output): the device's name,
the torch and CUDA versions, the steps done, the median step time (wall seconds between the ends of
consecutive learner steps, the first step left out once there are more: it also waits for the first
batch), the policy tokens trained per second (the ``tokens`` of the run's metrics.jsonl step rows
over those steps' time, and the median of their ``tokens_per_s``) and sampled per second (their
``sampled_tokens`` over the same time), the held-out success before and after, and the peak memory:
on CUDA the learner process's ``torch.cuda.max_memory_allocated`` and the most memory in use on the
whole device (every process, the rollout process and vLLM's reservation included; sampled every 0.2
s), on the CPU the peak resident memory of this process and of its finished children (the rollout
process). Exit code 0 when the run ended well with every step done.

On the device machine (nothing outside it is reachable; the in-code tiny model is built there from
the tokenizer corpus the working tree carries, so no weights travel), from the repository root::

    python3 benchmarks/gpu_check.py --device cuda --steps 5

Add ``--engine hf`` to take vLLM out of the picture when it fails, ``model.dtype=float32`` to compare
with float32 (and the compact forward), ``--preset`` for another preset whose model the machine
holds. CI runs it with ``--device cpu`` on the nano model (tests/trainer/test_gpu_check.py), so the
script cannot rot while no device is at hand.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a bare checkout (the device machine) need not have the package installed
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the learner and the rollout engine run",
    )
    p.add_argument("--preset", default="math-tiny", help="the preset to train (default math-tiny)")
    p.add_argument("--steps", type=int, default=5, help="RL steps to run (default 5)")
    p.add_argument(
        "--engine",
        choices=("auto", "hf", "vllm"),
        default="auto",
        help="rollout engine; auto: vllm when importable on cuda, else hf",
    )
    p.add_argument("--warm-start", type=int, default=32, help="demos of a one-epoch warm start (0: none)")
    p.add_argument("--eval-episodes", type=int, default=16, help="held-out problems per evaluation (0: none)")
    p.add_argument("--run-dir", help="write the run here (default: a temporary folder, removed afterwards)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, applied last")
    return p.parse_args(argv)


def cuda_or_exit(device: str) -> None:
    """Stop with a message naming ``--device`` when CUDA is asked for and not there."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda: no CUDA device is visible here (torch.cuda.is_available() is False, "
            f"torch {torch.__version__}, built with CUDA {torch.version.cuda}); pass --device cpu to run the "
            "check on the CPU",
            file=sys.stderr,
        )
        sys.exit(2)


def pick_engine(engine: str, device: str) -> str:
    if engine != "auto":
        return engine
    return "vllm" if device == "cuda" and importlib.util.find_spec("vllm") is not None else "hf"


def pick_dtype(device: str) -> str | None:
    """The model.dtype for ``device``: bfloat16 on a CUDA device that supports it, float32 on one
    that does not (float16 would need loss scaling, which the learner does not do); None on the
    CPU (the preset's own)."""
    if device != "cuda":
        return None
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"


def overrides_for(a: argparse.Namespace) -> list[str]:
    """The check's overrides of the preset, then the user's."""
    from fr_agents.config import load_config

    preset = load_config(a.preset)
    out = [
        f"trainer.device={a.device}",
        f"rollout.engine={pick_engine(a.engine, a.device)}",
        f"trainer.steps={a.steps}",
        "trainer.max_minutes=0",
        "trainer.plateau_patience=0",
        "trainer.collapse_guard=false",
        "trainer.checkpoint_every=0",
        "trainer.eval_every=0",
        "trainer.eval_k=0",
        f"trainer.eval_episodes={a.eval_episodes}",
        f"trainer.plot_every={max(1, a.steps)}",
    ]
    if dtype := pick_dtype(a.device):
        out.append(f"model.dtype={dtype}")
    demos = 0 if preset.tasks.source == "env-reset" else a.warm_start
    out += [f"warm_start.examples={demos}", "warm_start.epochs=1"]
    return out + list(a.overrides)


class DevicePeak:
    """The most memory in use on CUDA device 0 (every process), sampled every ``every_s`` seconds."""

    def __init__(self, every_s: float = 0.2) -> None:
        import torch

        self._torch, self.every_s, self.peak = torch, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-memory-sampler", daemon=True)

    def _sample(self) -> None:
        free, total = self._torch.cuda.mem_get_info(0)
        self.peak = max(self.peak, total - free)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> DevicePeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def step_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Step time and token rates of the ``step`` rows of metrics.jsonl. A step's time is the wall
    time between the ends of two consecutive learner steps (what its ``tokens_per_s`` divides by);
    the first step is left out when there are more (it includes the wait for the first batch).
    Rates are the steps' tokens over the steps' time; ``tokens_per_s`` of the single steps gives
    the median rate beside them."""
    elapsed = [r["elapsed_s"] for r in rows]
    times = [elapsed[0], *(b - a for a, b in zip(elapsed, elapsed[1:], strict=False))]
    steady = slice(1, None) if len(rows) > 1 else slice(None)
    seconds = sum(times[steady])
    sampled = [r.get("sampled_tokens") for r in rows[steady]]
    trained = sum(r["tokens"] for r in rows[steady])
    return {
        "step_time_median_s": statistics.median(times[steady]),
        "first_step_s": times[0],
        "policy_tokens_per_step": trained / len(rows[steady]),
        "policy_tokens_per_s": trained / seconds if seconds > 0 else float("nan"),
        "policy_tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows[steady]),
        "sampled_tokens_per_s": sum(sampled) / seconds
        if seconds > 0 and None not in sampled
        else float("nan"),
    }


def check(a: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    import torch

    from fr_agents.log import setup_logging
    from trainer.loop import load_run_config, main_train
    from trainer.metrics import read_metrics

    setup_logging()
    overrides = overrides_for(a)
    cfg = load_run_config(a.preset, overrides, None)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    t0 = time.perf_counter()
    peak = DevicePeak() if a.device == "cuda" else None
    error = None
    with peak if peak is not None else contextlib.nullcontext():
        try:
            code = main_train(a.preset, overrides, run_dir=str(run_dir))
        except Exception as e:  # noqa: BLE001 - a failed device run still reports what it got to
            traceback.print_exc()
            code, error = 1, f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r.get("kind") == "step"]
    start = next((r for r in rows if r.get("kind") == "start"), {})
    out: dict[str, Any] = {
        "device": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "preset": a.preset,
        "model": cfg.model.name,
        "dtype": cfg.model.dtype,
        "engine": start.get("engine", cfg.rollout.engine),
        "backend": cfg.trainer.backend,
        "steps_asked": cfg.trainer.steps,
        "steps_done": len(steps),
        "exit_code": code,
        "wall_s": wall,
    }
    if error:
        out["error"] = error
    if steps:
        out.update(step_figures(steps))
    for ev in (r for r in rows if r.get("kind") == "eval"):
        out[f"held_out_{ev['name']}"] = ev["success"]
    mib = 2**20
    if a.device == "cuda":
        out["peak_gpu_allocated_mib"] = torch.cuda.max_memory_allocated() / mib
        out["peak_gpu_reserved_mib"] = torch.cuda.max_memory_reserved() / mib
        out["peak_device_in_use_mib"] = peak.peak / mib if peak is not None else float("nan")
    else:  # ru_maxrss is in KiB on Linux
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["peak_rss_children_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return out


def report(out: dict[str, Any]) -> None:
    """The plain lines, then the JSON line."""
    lines = [
        f"device: {out['device']}",
        f"torch {out['torch']}, cuda {out['cuda'] or 'none (CPU build)'}",
        f"run: preset {out['preset']}, model {out['model']} in {out['dtype']}, engine {out['engine']}, "
        f"backend {out['backend']}, wall {out['wall_s']:.1f} s, exit code {out['exit_code']}",
        f"steps done: {out['steps_done']} of {out['steps_asked']}",
    ]
    if "error" in out:
        lines.append(f"error: {out['error']}")
    if out["steps_done"]:
        lines += [
            f"step time: median {out['step_time_median_s']:.3f} s (first step {out['first_step_s']:.3f} s, "
            "with the wait for the first batch)",
            f"policy tokens/s: {out['policy_tokens_per_s']:.0f} trained (median step "
            f"{out['policy_tokens_per_s_median']:.0f}; {out['policy_tokens_per_step']:.0f} "
            f"policy tokens a step), {out['sampled_tokens_per_s']:.0f} sampled",
        ]
    for key in (k for k in out if k.startswith("held_out_")):  # in the run's order
        lines.append(f"held-out success {key.removeprefix('held_out_')}: {100 * out[key]:.1f}%")
    if "peak_gpu_allocated_mib" in out:
        lines.append(
            f"peak GPU memory: {out['peak_gpu_allocated_mib']:.0f} MiB allocated by the "
            f"learner's process ({out['peak_gpu_reserved_mib']:.0f} MiB reserved), "
            f"{out['peak_device_in_use_mib']:.0f} MiB in use on the device (every process)"
        )
    else:
        lines.append(
            f"peak memory (CPU run): {out['peak_rss_mib']:.0f} MiB resident in this "
            f"process, {out['peak_rss_children_mib']:.0f} MiB in its largest "
            "finished child process (the rollout process, once the run got that far)"
        )
    print("\n".join(lines))
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    # the device machine reaches nothing outside it: never wait on the hub for a local model
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    a = parse_args(argv)
    if a.steps < 1:
        print("error: --steps must be >= 1", file=sys.stderr)
        sys.exit(2)
    cuda_or_exit(a.device)
    if a.run_dir:
        out = check(a, Path(a.run_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
            out = check(a, Path(tmp) / "run")
    report(out)
    return 0 if out["exit_code"] == 0 and out["steps_done"] == out["steps_asked"] else 1


if __name__ == "__main__":
    sys.exit(main())
