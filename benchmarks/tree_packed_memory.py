"""Peak memory and time of one learner step: tree-packed per root vs the flat form of the same batch.

Run: ``python benchmarks/tree_packed_memory.py [--roots 64 --leaves 16 --tokens 512 --shared 0.8]``
(``--quick``: 8 roots x 16 leaves x 128 tokens). The workload: each root's leaves share the first
``shared`` of their ``tokens`` (prompt, a first reply and its observation) and then branch, and every
root's prompt opens with the same ``--opening`` tokens (a system prompt; 0 by default); ``--leaves 1``
is a linear batch. One :class:`trainer.learner.Learner` step (FlashREINFORCE, fp32; ``--model``: the
micro dims of a tiny Qwen2, or SmolLM2-135M's real weights) runs on the flat ``[B, T]`` batch and on
the per-root packed batch, each in its own process so that peak memory is measured cleanly.
``--micro-batch-tokens 0`` (default) runs each form as one forward, the fair whole-batch comparison;
the packed form never builds the whole-batch N x N mask.

The forms: ``flat`` and ``packed`` as the learner runs them (the compact forward of
:mod:`fr_agents.models.compact` for both: an opening the rows or roots share once, each tree once);
``packed-tree`` and ``packed-dense``, the packed rows through transformers' forward with tree attention
(:mod:`fr_agents.tree.attention`) or the dense ``[W, W]`` mask per root (the learner's packed step
before it took the compact forward, and what a model outside the compact forward's families gets).

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA. On CPU, the process's peak growth of
resident plus swapped memory: the larger of its peak RSS growth (``ru_maxrss``, exact while nothing
is swapped) and the peak of ``VmRSS + VmSwap`` sampled every 5 ms by a thread, which also counts what
the kernel moved to swap. So a flat step larger than the machine's RAM (64 roots x 16 leaves x 512
tokens needs ~33 GB) is measured with swap on rather than refused: ``--swap-gib N`` makes a swap file
for the run (root only) and removes it after. Such a step's *time* includes swap I/O, which would
flatter the packed form, so ``--flat-chunk-tokens N`` adds a fourth form, ``flat-chunked``: the same
flat rows stepped in micro-batches of N tokens (the same gradient, the same arithmetic, a bounded
peak), timed without swap; the time ratio against it is the honest one there. ``--forms`` measures
a subset.

Prints the peak of each form, the ratio packed/flat (goal <= 0.5), the time ratio of each flat form
over each packed form against the ideal ratio logical/packed tokens (goal >= 0.8 of it), from the
median of each form's steps (``--repeat`` a process, its first left out when it ran more than one: that
one pays the process's allocations and kernel set-up). ``--rounds N`` runs every form's process N
times in alternating order (flat, packed, packed, flat, ...) and also prints the per-token ratio
round by round: step times drift by +-10% on a shared VM, and a ratio from one process per form
cannot tell a few percent from that drift. Ratios are the result, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


FORMS = ("flat", "packed", "packed-tree", "packed-dense", "flat-chunked")
PACKED_FORMS = ("packed", "packed-tree", "packed-dense")


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def build_batch(roots: int, leaves: int, tokens: int, shared: float, seed: int = 0, opening: int = 0):  # noqa: ANN201
    """Trajectories as the tree stores them: per root, a shared prefix then ``leaves`` tails; every
    root's prompt opens with the same ``opening`` tokens."""
    from fr_agents.tree import TrajectoryTree

    rng = random.Random(seed)
    tree = TrajectoryTree()
    prompt_n = max(2, tokens // 10, opening + 2)
    opening_ids = [rng.randrange(1, 1000) for _ in range(opening)]
    shared_n = int(tokens * shared)
    reply_n = max(1, (shared_n - prompt_n) * 2 // 3)
    obs_n = max(1, shared_n - prompt_n - reply_n)
    tail_n = tokens - prompt_n - reply_n - obs_n
    ids = []
    for _ in range(roots):
        root = tree.add_root(opening_ids + [rng.randrange(1, 1000) for _ in range(prompt_n - opening)])
        n = tree.append(root, [rng.randrange(1, 1000) for _ in range(reply_n)], [-1.0] * reply_n, True, 0)
        n = tree.append(n, [rng.randrange(1, 1000) for _ in range(obs_n)], None, False, 0)
        for _ in range(leaves):
            tail = [rng.randrange(1, 1000) for _ in range(tail_n)]
            ids.append(tree.finish(tree.append(n, tail, [-1.0] * tail_n, True, 0), float(rng.random() < 0.5)))
    return tree, ids


def resident_and_swapped() -> tuple[int, int]:
    """This process's (resident, swapped) memory in bytes (``/proc/self/status``: VmRSS, VmSwap)."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmSwap:")):
                got[line.split(":")[0]] = int(line.split()[1]) * 1024
    return got.get("VmRSS", 0), got.get("VmSwap", 0)


class PeakSampler:
    """Samples :func:`resident_and_swapped` every ``period`` seconds in a thread; ``peak`` is the
    largest seen.

    torch's kernels release the GIL, so the thread keeps sampling during a step. A sampler can miss a
    spike shorter than its period, which is why the CPU figure also takes ``ru_maxrss`` (exact for RSS).
    """

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.peak = 0  # resident + swapped
        self.swapped_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sample()

    def _sample(self) -> None:
        rss, swap = resident_and_swapped()
        self.peak = max(self.peak, rss + swap)
        self.swapped_peak = max(self.swapped_peak, swap)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def one_step(form: str, a: argparse.Namespace) -> dict[str, float]:
    import torch
    import transformers

    from fr_agents.models.forward import ForwardConfig
    from fr_agents.objective_config import ObjectiveConfig
    from fr_agents.tree.batch import build_flat, build_packed
    from trainer.learner import Chunking, Learner

    torch.manual_seed(0)
    device = torch.device(a.device)
    tree, ids = build_batch(a.roots, a.leaves, a.tokens, a.shared, opening=a.opening)
    trajs = tree.trajectories(ids)
    flat_form = form.startswith("flat")
    make = build_flat if flat_form else build_packed
    batch = make(trajs)
    micro = a.flat_chunk_tokens if form == "flat-chunked" else a.micro_batch_tokens
    if a.model == "smollm2":
        from fr_agents.models import load_policy

        model = load_policy("smollm2-135m")[0].float().to(device)
    else:
        cfg = transformers.Qwen2Config(
            vocab_size=1024,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max(1024, a.tokens + 1),
            tie_word_embeddings=False,
        )
        cfg._attn_implementation = "sdpa"
        model = transformers.Qwen2ForCausalLM(cfg).float().to(device)
    learner = Learner(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        objective=ObjectiveConfig(delta=float("inf")),
        chunking=Chunking(micro_batch_tokens=micro, packed="never" if flat_form else "always"),
        forward=ForwardConfig(
            compact_forward=form in ("flat", "flat-chunked", "packed"),
            tree_attention=form == "packed-tree",
            tree_min_saving=0,
        ),
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        base_sampled = sum(resident_and_swapped())
    times = []
    with PeakSampler() as sampler:
        for i in range(
            a.repeat
        ):  # lr 0: every step sees the same model; the batch is rebuilt (a batch is used once)
            if i:
                batch = make(trajs)
            t0 = time.perf_counter()
            stats = learner.step(batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base, sampler.peak - base_sampled
        )
    seconds = statistics.median(times)
    flat = batch if flat_form else batch.flat
    return {
        "peak_bytes": float(peak),
        "swapped_peak_bytes": float(sampler.swapped_peak),
        "seconds": seconds,
        "all_seconds": times,
        "forward_tokens": stats["forward_tokens"],
        "logical_tokens": float(flat.lengths.sum()),
        "packed_tokens": float(flat.lengths.sum()) if flat_form else float(batch.num_tokens),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--roots", type=int, default=64)
    p.add_argument("--leaves", type=int, default=16)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--shared", type=float, default=0.8)
    p.add_argument(
        "--opening", type=int, default=0, help="tokens every root's prompt opens with (a system prompt)"
    )
    p.add_argument(
        "--model",
        choices=("qwen2-micro", "smollm2"),
        default="qwen2-micro",
        help="qwen2-micro: a randomly initialised tiny Qwen2 (hidden 128, 4 layers); "
        "smollm2: SmolLM2-135M's weights",
    )
    p.add_argument("--micro-batch-tokens", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="steps per form process; the median of those after its first is reported",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="> 1: run every form's process this many times, in alternating order (ABBA...), so that a "
        "drift of the machine's speed falls on both forms alike; each process's first step (its one-time "
        "allocations and kernel set-up) is left out of the medians when --repeat >= 2, and the time "
        "per token of each packed form over flat is printed per round",
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--swap-gib",
        type=int,
        default=0,
        help="make a swap file of this size (root only) for the run and remove it after, so that a flat "
        "step larger than RAM can be measured; its time then includes swap I/O and is reported as such",
    )
    p.add_argument(
        "--swap-file", default="/var/tmp/fr-agents-bench.swap", help="where --swap-gib puts its file"
    )
    p.add_argument(
        "--flat-chunk-tokens",
        type=int,
        default=0,
        help=(
            "> 0: also time the flat form in micro-batches of this many tokens "
            "(form flat-chunked: the same rows and gradient, a bounded peak), "
            "the flat step's time without swap when the whole one does not fit"
        ),
    )
    p.add_argument(
        "--forms",
        nargs="+",
        choices=FORMS,
        default=None,
        help=(
            "the forms to measure (default: flat, packed, packed-dense, and "
            "flat-chunked with --flat-chunk-tokens)"
        ),
    )
    p.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="run every form's process with glibc told to keep what it frees (MALLOC_MMAP_MAX_=0, "
        "MALLOC_TRIM_THRESHOLD_ huge), so that steps after the first reuse their pages instead of "
        "faulting fresh ones in; on this VM a fresh page costs ~5x more once ~12 GB are resident",
    )
    p.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)  # one measurement (child process)
    a = p.parse_args()
    if a.quick:
        a.roots, a.leaves, a.tokens = 8, 16, 128
    if a.form:
        import torch

        torch.set_num_threads(2)
        print(json.dumps(one_step(a.form, a)))
        return
    if a.swap_gib < 0:
        p.error(f"--swap-gib must be >= 0, got {a.swap_gib}")
    if a.swap_gib and os.geteuid() != 0:
        p.error("--swap-gib needs root (swapon)")
    forms = a.forms or [f for f in FORMS if f != "flat-chunked" or a.flat_chunk_tokens]
    if "flat-chunked" in forms and a.flat_chunk_tokens <= 0:
        p.error("--forms flat-chunked: needs --flat-chunk-tokens > 0")
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    out: dict[str, dict] = {}
    rounds: list[dict[str, dict]] = []
    order = [forms if r % 2 == 0 else forms[::-1] for r in range(a.rounds)]
    with swap_file(Path(a.swap_file), a.swap_gib):
        for r, round_forms in enumerate(order):
            if a.rounds > 1:
                print(f"round {r + 1} of {a.rounds}: {', '.join(round_forms)}", file=sys.stderr, flush=True)
            rounds.append(run_forms(round_forms, a))
    for form in forms:
        runs = [one[form] for one in rounds]
        steps = [t for one in runs for t in steady(one["all_seconds"])]
        out[form] = {
            **runs[0],
            "peak_bytes": max(one["peak_bytes"] for one in runs),
            "swapped_peak_bytes": max(one["swapped_peak_bytes"] for one in runs),
            "seconds": statistics.median(steps),
            "all_seconds": steps,
        }
    report(out, a)
    if a.rounds > 1 and "flat" in out:

        def per_token(one: dict) -> float:
            return statistics.median(steady(one["all_seconds"])) / one["forward_tokens"]

        for form in PACKED_FORMS:
            if form in out:
                each = [per_token(one[form]) / per_token(one["flat"]) for one in rounds]
                print(
                    f"  {form} / flat, time per token the model ran, round by round: "
                    + ", ".join(f"{x:.2f}" for x in each)
                )


def steady(seconds: list[float]) -> list[float]:
    """A process's step times without its first (one-time allocations and kernel set-up) when it
    ran more than one."""
    return seconds[1:] if len(seconds) > 1 else seconds


def run_forms(forms: list[str], a: argparse.Namespace) -> dict[str, dict]:
    """One process per form, one after another; each returns :func:`one_step`'s figures."""
    out = {}
    for form in forms:
        cmd = [
            sys.executable,
            __file__,
            "--form",
            form,
            "--roots",
            str(a.roots),
            "--leaves",
            str(a.leaves),
            "--tokens",
            str(a.tokens),
            "--shared",
            str(a.shared),
            "--opening",
            str(a.opening),
            "--model",
            a.model,
            "--micro-batch-tokens",
            str(a.micro_batch_tokens),
            "--flat-chunk-tokens",
            str(a.flat_chunk_tokens),
            "--device",
            a.device,
            "--repeat",
            str(a.repeat),
        ]
        env = dict(os.environ)
        if a.keep_freed_memory:
            env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**62))
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            sys.exit(f"the {form} step failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
        out[form] = json.loads(res.stdout.strip().splitlines()[-1])
        print(
            f"  {form}: peak {out[form]['peak_bytes'] / 2**20:,.0f} MiB (swapped at most "
            f"{out[form]['swapped_peak_bytes'] / 2**20:,.0f} MiB), steps "
            + ", ".join(f"{t:.2f}" for t in out[form]["all_seconds"])
            + f" s, {time.perf_counter() - t0:.0f} s "
            f"in all ({load()})",
            file=sys.stderr,
            flush=True,
        )
    return out


def report(out: dict[str, dict], a: argparse.Namespace) -> None:
    """Print the figures of the forms in ``out`` (each ratio only where both of its forms were measured)."""
    any_form = next(iter(out.values()))
    packed_any = next((out[f] for f in PACKED_FORMS if f in out), None)  # all hold the same packed tokens
    ideal = any_form["logical_tokens"] / packed_any["packed_tokens"] if packed_any else math.nan
    print(
        f"[tree-packed step] {a.model}, {a.roots} roots x {a.leaves} leaves, {a.tokens} tokens, "
        f"{a.shared:.0%} shared, an opening of {a.opening} tokens every root shares, "
        f"device {a.device}, micro_batch_tokens={a.micro_batch_tokens}"
        + (", freed memory kept (glibc)" if a.keep_freed_memory else "")
    )
    print(
        f"  tokens: logical {any_form['logical_tokens']:,.0f}  packed "
        + (f"{packed_any['packed_tokens']:,.0f} (ideal speed-up {ideal:.2f}x)" if packed_any else "-")
    )
    print(
        "  tokens the model ran (each form's forward_tokens): "
        + "  ".join(f"{f} {r['forward_tokens']:,.0f}" for f, r in out.items())
    )
    print("  peak memory: " + "  ".join(f"{f} {r['peak_bytes'] / 2**20:,.0f} MiB" for f, r in out.items()))
    for ref in ("flat", "flat-chunked"):
        if ref not in out:
            continue
        for form in PACKED_FORMS:
            if form not in out:
                continue
            speed = out[ref]["seconds"] / out[form]["seconds"]
            mem = (
                f", memory {form}/{ref} "
                f"{out[form]['peak_bytes'] / max(1.0, out[ref]['peak_bytes']):.2f} (goal <= 0.5)"
                if ref == "flat"
                else ""
            )
            print(
                f"  {form} vs {ref}: step time {speed:.2f}x, {speed / ideal:.2f} of ideal (goal >= 0.8){mem}"
            )
    if "flat" in out:
        per_flat = out["flat"]["seconds"] / out["flat"]["forward_tokens"]
        for form in PACKED_FORMS:
            if form in out:
                per = out[form]["seconds"] / out[form]["forward_tokens"]
                ran = out["flat"]["forward_tokens"] / out[form]["forward_tokens"]
                print(
                    f"  {form}: {per / per_flat:.2f}x the flat step's time per token the model ran "
                    f"(goal <= 1); it ran {ran:.2f}x fewer tokens than the flat step, which shares its "
                    "rows' opening too"
                )
    if "flat-chunked" in out:
        print(
            f"  (flat-chunked: the flat rows in micro-batches of {a.flat_chunk_tokens:,} tokens, the "
            "same gradient; its steps take the same arithmetic as the whole flat step without its peak)"
        )
    for form, r in out.items():
        if r["swapped_peak_bytes"]:
            print(
                f"  note: the {form} step swapped (up to {r['swapped_peak_bytes'] / 2**20:,.0f} "
                "MiB): its memory counts what was swapped; its time includes swap I/O, so a "
                "time ratio against it flatters the other forms"
            )
    print(f"  ({load()})")


@contextlib.contextmanager
def swap_file(path: Path, gib: int):  # noqa: ANN201
    """A swap file of ``gib`` GiB, on for the block and removed after (nothing when ``gib`` is 0)."""
    if not gib:
        yield
        return
    if path.exists():
        sys.exit(f"--swap-file {path} exists already; remove it or pick another path")
    subprocess.run(["fallocate", "-l", f"{gib}G", str(path)], check=True)
    try:
        path.chmod(0o600)
        subprocess.run(["mkswap", str(path)], check=True, capture_output=True)
        subprocess.run(["swapon", str(path)], check=True)
        print(f"  swap on: {gib} GiB at {path}", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            subprocess.run(["swapoff", str(path)], check=False)
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
