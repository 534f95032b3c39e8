"""Peak memory and time of one learner step: tree-packed per root vs the flat form of the same batch.

Run: ``python benchmarks/tree_packed_memory.py [--roots 64 --leaves 16 --tokens 512 --shared 0.8]``
(``--quick``: 8 roots x 16 leaves x 128 tokens). The workload: each root's leaves share the first
``shared`` of their ``tokens`` (prompt, a first reply and its observation) and then branch; one
:class:`trainer.learner.Learner` step (FlashREINFORCE, the micro dims of the tiny Qwen2, fp32) runs on
the flat ``[B, T]`` batch and on the per-root packed batch, each in its own process so that peak
memory is measured cleanly: ``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS
growth on CPU. ``--micro-batch-tokens 0`` (default) runs each form as one forward, the fair
whole-batch comparison; the packed form never builds the whole-batch N x N mask. The packed form
runs with tree attention (:mod:`fr_agents.tree.attention`, the learner's default); a third process
runs it with the dense ``[W, W]`` mask per root instead, to show what tree attention saves.

Prints both figures, the ratio packed/flat (goal <= 0.5), the time ratio flat/packed against the
ideal ratio logical/packed tokens (goal >= 0.8 of it), from the median of ``--repeat`` steps per
form. Ratios are the result, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


FORMS = ("flat", "packed", "packed-dense")


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def build_batch(roots: int, leaves: int, tokens: int, shared: float, seed: int = 0):  # noqa: ANN201
    """Trajectories as the tree stores them: per root, a shared prefix then ``leaves`` tails."""
    from fr_agents.tree import TrajectoryTree

    rng = random.Random(seed)
    tree = TrajectoryTree()
    prompt_n = max(2, tokens // 10)
    shared_n = int(tokens * shared)
    reply_n = max(1, (shared_n - prompt_n) * 2 // 3)
    obs_n = max(1, shared_n - prompt_n - reply_n)
    tail_n = tokens - prompt_n - reply_n - obs_n
    ids = []
    for _ in range(roots):
        root = tree.add_root([rng.randrange(1, 1000) for _ in range(prompt_n)])
        n = tree.append(root, [rng.randrange(1, 1000) for _ in range(reply_n)], [-1.0] * reply_n, True, 0)
        n = tree.append(n, [rng.randrange(1, 1000) for _ in range(obs_n)], None, False, 0)
        for _ in range(leaves):
            tail = [rng.randrange(1, 1000) for _ in range(tail_n)]
            ids.append(tree.finish(tree.append(n, tail, [-1.0] * tail_n, True, 0), float(rng.random() < 0.5)))
    return tree, ids


def one_step(form: str, a: argparse.Namespace) -> dict[str, float]:
    import torch
    import transformers

    from fr_agents.tree.batch import build_flat, build_packed
    from trainer.learner import Learner

    torch.manual_seed(0)
    device = torch.device(a.device)
    tree, ids = build_batch(a.roots, a.leaves, a.tokens, a.shared)
    trajs = tree.trajectories(ids)
    batch = build_flat(trajs) if form == "flat" else build_packed(trajs)
    cfg = transformers.Qwen2Config(
        vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(1024, a.tokens + 1),
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen2ForCausalLM(cfg).float().to(device)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.0), micro_batch_tokens=a.micro_batch_tokens,
                      packed="never" if form == "flat" else "always", tree_attention=form == "packed", tree_min_saving=0,
                      delta=float("inf"))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for i in range(a.repeat):  # lr 0: every step sees the same model; the batch is rebuilt (a batch is used once)
        if i:
            batch = build_flat(trajs) if form == "flat" else build_packed(trajs)
        t0 = time.perf_counter()
        stats = learner.step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seconds = statistics.median(times)
    flat = batch if form == "flat" else batch.flat
    return {
        "peak_bytes": float(peak),
        "seconds": seconds,
        "forward_tokens": stats["forward_tokens"],
        "logical_tokens": float(flat.lengths.sum()),
        "packed_tokens": float(flat.lengths.sum()) if form == "flat" else float(batch.num_tokens),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--roots", type=int, default=64)
    p.add_argument("--leaves", type=int, default=16)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--shared", type=float, default=0.8)
    p.add_argument("--micro-batch-tokens", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=3, help="steps per form; the median time is reported")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)  # one measurement (child process)
    a = p.parse_args()
    if a.quick:
        a.roots, a.leaves, a.tokens = 8, 16, 128
    if a.form:
        import torch

        torch.set_num_threads(2)
        print(json.dumps(one_step(a.form, a)))
        return
    out = {}
    for form in FORMS:
        cmd = [sys.executable, __file__, "--form", form, "--roots", str(a.roots), "--leaves", str(a.leaves),
               "--tokens", str(a.tokens), "--shared", str(a.shared), "--micro-batch-tokens", str(a.micro_batch_tokens),
               "--device", a.device, "--repeat", str(a.repeat)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[form] = json.loads(res.stdout.strip().splitlines()[-1])
    flat, packed, dense = out["flat"], out["packed"], out["packed-dense"]
    ideal = packed["logical_tokens"] / packed["packed_tokens"]
    speed = flat["seconds"] / packed["seconds"]
    print(f"[tree-packed step] {a.roots} roots x {a.leaves} leaves, {a.tokens} tokens, {a.shared:.0%} shared, "
          f"device {a.device}, micro_batch_tokens={a.micro_batch_tokens}")
    print(f"  tokens: logical {flat['logical_tokens']:,.0f}  packed {packed['packed_tokens']:,.0f}  "
          f"(forward incl. padding: flat {flat['forward_tokens']:,.0f}, packed {packed['forward_tokens']:,.0f})")
    print(f"  peak memory: flat {flat['peak_bytes'] / 2**20:,.0f} MiB  packed {packed['peak_bytes'] / 2**20:,.0f} MiB  "
          f"-> packed/flat {packed['peak_bytes'] / max(1.0, flat['peak_bytes']):.2f} (goal <= 0.5)")
    print(f"  step time flat/packed {speed:.2f}x, ideal {ideal:.2f}x -> {speed / ideal:.2f} of ideal (goal >= 0.8)")
    print(f"  the same packed step with the dense [W, W] mask per root instead of tree attention: "
          f"{dense['peak_bytes'] / 2**20:,.0f} MiB, flat/packed-dense {flat['seconds'] / dense['seconds']:.2f}x "
          f"({flat['seconds'] / dense['seconds'] / ideal:.2f} of ideal)")
    print(f"  ({load()})")


if __name__ == "__main__":
    main()
