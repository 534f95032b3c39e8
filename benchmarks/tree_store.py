"""Trajectory-tree benchmark: sharing, append throughput, memory per token, packed training.

Run: ``python benchmarks/tree_store.py [--quick]``. Prints:

1. stored/unique token ratio on 64 roots x 16 branches that share about 80% of their tokens,
   every branch appending its whole path independently (the tree must find the sharing itself);
   "unique" is the size of an ideal token trie, computed here by hashing (goal <= 1.05);
2. appends per second, in memory and durable (file, WAL), plus durable finishes per second;
3. bytes per stored token of the in-memory store (SQLite pages / stored tokens; goal <= 16);
4. packed vs per-leaf forward+backward time on the tiny Qwen2 (the ``micro`` dims of
   ``fr_agents.models.tiny``, fp32, CPU), as a fraction of the ideal token ratio (goal >= 0.8).
   Both are timed in the same run; ratios only, never bare absolute times as the result.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fr_agents.tree import TrajectoryTree  # noqa: E402

PROMPT, TURN1, OBS, TAIL = 40, 150, 50, 60  # shared 240 of 300 tokens per path = 80%


def _episode(rng: random.Random, n: int, vocab: int = 1000) -> tuple[list[int], list[float]]:
    return [rng.randrange(vocab) for _ in range(n)], [-rng.randrange(1, 4000) / 1000 for _ in range(n)]


def build_workload(tree: TrajectoryTree, roots: int, branches: int, seed: int = 0) -> tuple[list[int], int]:
    """Every branch re-appends the shared prompt/turn/observation, then its own tail.

    Returns (leaf ids, unique tokens of an ideal trie)."""
    rng = random.Random(seed)
    unique: set[tuple[int, int]] = set()
    leaves: list[int] = []
    for r in range(roots):
        prompt = [rng.randrange(1000) for _ in range(PROMPT)]
        turn1 = _episode(rng, TURN1)
        obs = [rng.randrange(1000) for _ in range(OBS)]
        for _b in range(branches):
            root = tree.add_root(prompt)
            n = tree.append(root, turn1[0], turn1[1], True, 0)
            n = tree.append(n, obs, None, False, 0)
            tail = _episode(rng, TAIL)
            n = tree.append(n, tail[0], tail[1], True, 0)
            leaves.append(tree.finish(n, rng.random()))
            # ideal trie: one entry per distinct (root, prefix) -- a chained hash names the prefix
            h = hash(("root", r))
            ident = (
                [(t, 0.0, False) for t in prompt]
                + [(t, lp, True) for t, lp in zip(*turn1, strict=True)]
                + [(t, 0.0, False) for t in obs]
                + [(t, lp, True) for t, lp in zip(*tail, strict=True)]
            )
            for k, x in enumerate(ident):
                h = hash((h, x))
                unique.add((k, h))
    return leaves, len(unique)


def bench_sharing(roots: int, branches: int) -> TrajectoryTree:
    tree = TrajectoryTree()
    _, unique = build_workload(tree, roots, branches)
    s = tree.stats()
    print(
        f"[sharing] {roots} roots x {branches} branches, "
        f"{PROMPT + TURN1 + OBS}/{PROMPT + TURN1 + OBS + TAIL} tokens shared"
    )
    print(f"  logical tokens       {s['logical_tokens']:>10,}")
    print(f"  stored tokens        {s['stored_tokens']:>10,}   unique (ideal trie) {unique:,}")
    print(f"  stored/unique ratio  {s['stored_tokens'] / unique:>10.3f}   (goal <= 1.05)")
    print(f"  logical/stored       {s['logical_tokens'] / s['stored_tokens']:>10.2f}x dedup")
    print(
        f"  bytes/stored token   {s['db_bytes'] / s['stored_tokens']:>10.2f}   "
        "(in-memory SQLite pages; goal <= 16)"
    )
    return tree


def bench_appends(n_episodes: int) -> None:
    def run(tree: TrajectoryTree) -> tuple[float, float, float]:
        rng = random.Random(1)
        appends = finishes = 0
        t_append = t_finish = 0.0
        for e in range(n_episodes):
            t0 = time.perf_counter()
            node = tree.add_root([e % 50, 1, 2, 3])
            for _turn in range(4):
                toks, lps = _episode(rng, 24)
                node = tree.append(node, toks, lps, True, e // 100)
                node = tree.append(node, toks[:8], None, False, 0)
                appends += 2
            t1 = time.perf_counter()
            tree.finish(node, 1.0)
            finishes += 1
            t_append += t1 - t0
            t_finish += time.perf_counter() - t1
        return appends / t_append, finishes / t_finish, (appends + finishes) / (t_append + t_finish)

    mem = run(TrajectoryTree())
    with tempfile.TemporaryDirectory() as d, TrajectoryTree.open(Path(d) / "bench.db") as tree:
        dur = run(tree)
    print(f"[appends] {n_episodes} episodes x 8 appends (24/8-token segments) + 1 finish")
    print(f"  in memory: {mem[0]:>9,.0f} appends/s  {mem[1]:>8,.0f} finishes/s")
    print(f"  durable  : {dur[0]:>9,.0f} appends/s  {dur[1]:>8,.0f} finishes/s (fsync per finish)")
    print(f"  durable/in-memory append throughput: {dur[0] / mem[0]:.2f}")


def bench_packed(tree: TrajectoryTree, batch: int, reps: int) -> None:
    import torch
    import transformers

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen2ForCausalLM(cfg).float()
    ids = tree.take_batch(batch, max_per_root=5, prune=False)
    assert ids is not None
    flat = tree.export_flat(ids)
    packed = tree.export_packed(ids)
    mask = packed.attention_mask(torch.float32)

    def per_leaf() -> None:
        model.zero_grad(set_to_none=True)
        for i, n in enumerate(flat.lengths.tolist()):
            tok = flat.token_ids[i : i + 1, :n]
            lp = torch.log_softmax(model(tok).logits[0, :-1], -1).gather(-1, tok[0, 1:, None])
            (lp * flat.action_mask[i, 1:n, None]).sum().backward()

    def padded() -> None:
        model.zero_grad(set_to_none=True)
        lp = flat.gather_logprobs(model(flat.token_ids, attention_mask=flat.attention_mask.long()).logits)
        (lp * flat.action_mask).sum().backward()

    def tree_packed() -> None:
        model.zero_grad(set_to_none=True)
        out = model(packed.input_ids, attention_mask=mask, position_ids=packed.position_ids)
        (packed.gather_logprobs(out.logits) * flat.action_mask).sum().backward()

    def timed(fn) -> float:  # noqa: ANN001
        fn()  # warm-up
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_leaf, t_pad, t_pack = timed(per_leaf), timed(padded), timed(tree_packed)
    logical = int(flat.lengths.sum())
    ideal = logical / packed.num_tokens
    padded_ideal = flat.token_ids.numel() / packed.num_tokens
    print(
        f"[packed] B={len(ids)} leaves ({len(set(flat.root_ids))} roots, <=5 "
        "per root), tiny Qwen2 micro dims, fp32 CPU"
    )
    print(
        f"  tokens: per-leaf {logical:,}  padded {flat.token_ids.numel():,}  packed N={packed.num_tokens:,}"
    )
    print(f"  ideal token ratio per-leaf/packed  {ideal:.2f}x")
    print(
        f"  measured speed-up per-leaf/packed  {t_leaf / t_pack:.2f}x  -> "
        f"{t_leaf / t_pack / ideal:.2f} of ideal (goal >= 0.8)"
    )
    print(
        f"  measured speed-up padded/packed    {t_pad / t_pack:.2f}x  -> "
        f"{t_pad / t_pack / padded_ideal:.2f} of ideal {padded_ideal:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    a = ap.parse_args()
    tree = bench_sharing(8 if a.quick else 64, 16)
    bench_appends(100 if a.quick else 500)
    bench_packed(tree, 10 if a.quick else 20, 1 if a.quick else 3)


if __name__ == "__main__":
    main()
