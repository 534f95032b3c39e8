"""Tree attention (block-sparse over a packed row) == attention under the dense ancestor-causal mask.

Random trees of random depth, fan-out and segment lengths are packed per root; a small block size
(3) makes most segments span several query blocks and several key buckets. The attention output
and its gradients are compared with ``scaled_dot_product_attention`` under the dense ``[W, W]``
mask, in float64, at every real (non-padding) position; then the whole tiny Qwen2 forward.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

transformers = pytest.importorskip("transformers")

from fr_agents.tree import TrajectoryTree  # noqa: E402
from fr_agents.tree.attention import (  # noqa: E402
    TreeLayout,
    supports_tree_attention,
    tree_attention,
    tree_attention_forward,
    tree_attention_pays,
)
from fr_agents.tree.batch import build_packed  # noqa: E402


def random_tree(seed: int, roots: int = 3) -> list:
    rng = random.Random(seed)
    tree = TrajectoryTree()
    leaves = []

    def grow(node: int, depth: int) -> None:
        kids = 1 if depth == 0 else rng.choice([0, 1, 2, 3])
        if kids == 0 or depth > 3:
            leaves.append(tree.finish(node, rng.random()))
            return
        for _ in range(kids):
            n = rng.randint(1, 12)
            policy = rng.random() < 0.6
            child = tree.append(
                node, [rng.randrange(1, 40) for _ in range(n)], [-1.0] * n if policy else None, policy, 0
            )
            grow(child, depth + 1)

    for _ in range(roots):
        grow(tree.add_root([rng.randrange(1, 40) for _ in range(rng.randint(2, 9))]), 0)
    return tree.trajectories(leaves)


class _Attn(torch.nn.Module):  # what transformers' attention functions read off the layer
    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("seed", range(6))
def test_tree_attention_equals_the_dense_ancestor_mask_with_gradients(seed: int) -> None:
    packed = build_packed(random_tree(seed))
    roots = list(range(len(packed.root_spans)))
    dense = packed.root_chunk(roots, torch.float64)
    layout = packed.tree_layout(roots, block=3)
    r, w = dense["input_ids"].shape
    h, hkv, d = 4, 2, 8
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(r, n, w, d, generator=g, dtype=torch.float64, requires_grad=True) for n in (h, hkv, hkv)
    )
    real = torch.zeros(r, w, dtype=torch.bool)
    for i, root in enumerate(roots):
        a, b = packed.root_spans[root]
        real[i, : b - a] = True
    weight = torch.randn(r, w, h, d, generator=g, dtype=torch.float64) * real[:, :, None, None]

    out, _ = tree_attention_forward(_Attn(), q, k, v, None, scaling=0.3, tree_layout=layout)
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense["attention_mask"], scale=0.3
    ).transpose(1, 2)
    assert layout.calls == 1
    assert torch.allclose(out[real], ref[real], atol=1e-12)
    assert bool((out[~real] == 0).all())  # padding gets no block
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    # the cost: scores computed, padding included, against the dense W x W per root
    assert layout.scores < r * w * w


def test_a_qwen2_forward_with_tree_attention_equals_the_dense_mask_and_restores_sdpa() -> None:
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen2ForCausalLM(cfg).double().eval()
    packed = build_packed(random_tree(7, roots=4))
    roots = list(range(len(packed.root_spans)))
    part = packed.root_chunk(roots, torch.float64)
    layout = packed.tree_layout(roots)
    with torch.no_grad():
        ref = model(
            input_ids=part["input_ids"],
            position_ids=part["position_ids"],
            attention_mask=part["attention_mask"],
        ).logits
        with tree_attention(model):
            out = model(
                input_ids=part["input_ids"], position_ids=part["position_ids"], tree_layout=layout
            ).logits
    assert layout.calls == cfg.num_hidden_layers
    assert model.config._attn_implementation == "sdpa"
    flat_index = torch.cat(
        [
            torch.arange(a, b) - a + i * part["input_ids"].shape[1]
            for i, (a, b) in enumerate(packed.root_spans[r] for r in roots)
        ]
    )
    assert torch.allclose(out.reshape(-1, 48)[flat_index], ref.reshape(-1, 48)[flat_index], atol=1e-10)


def test_layout_refuses_rows_wider_than_the_width_and_a_bad_block() -> None:
    anc = torch.eye(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="segments: row 0"):
        TreeLayout.build([torch.zeros(5, dtype=torch.long)], anc, width=4)
    with pytest.raises(ValueError, match="block"):
        TreeLayout.build([torch.zeros(3, dtype=torch.long)], anc, width=4, block=0)


def test_only_sdpa_models_without_sliding_windows_take_tree_attention() -> None:
    def qwen2(attn: str, **kw: object) -> torch.nn.Module:
        cfg = transformers.Qwen2Config(
            vocab_size=48,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **kw,
        )
        cfg._attn_implementation = attn
        return transformers.Qwen2ForCausalLM(cfg)

    assert supports_tree_attention(qwen2("sdpa"))
    assert not supports_tree_attention(qwen2("eager"))
    windowed = qwen2("sdpa", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert "sliding_attention" in windowed.config.layer_types
    assert not supports_tree_attention(windowed)


@pytest.mark.parametrize("seed", range(4))
def test_attention_pairs_count_the_allowed_pairs_of_the_chosen_roots(seed: int) -> None:
    packed = build_packed(random_tree(seed, roots=4))
    allowed = packed.allowed()
    for roots in ([0], [1, 3], list(range(len(packed.root_spans)))):
        want = sum(int(allowed[a:b, a:b].sum()) for a, b in (packed.root_spans[r] for r in roots))
        assert packed.attention_pairs(roots) == want
        # no layout computes fewer scores than the pairs its tokens may attend
        assert packed.tree_layout(roots, block=3).scores >= want


def test_tree_attention_pays_only_for_the_asked_saving() -> None:
    assert tree_attention_pays(dense_scores=200, tree_scores=100)  # the default: 2x fewer scores
    assert not tree_attention_pays(dense_scores=199, tree_scores=100)
    assert tree_attention_pays(dense_scores=150, tree_scores=100, min_saving=1.5)
    assert tree_attention_pays(dense_scores=1, tree_scores=100, min_saving=0)  # 0: always


@pytest.mark.parametrize("seed", range(3))
def test_one_gather_per_tensor_reads_every_real_position_once_and_padding_reads_the_zero_row(
    seed: int,
) -> None:
    packed = build_packed(random_tree(seed, roots=4))
    roots = list(range(len(packed.root_spans)))
    layout = packed.tree_layout(roots, block=3)
    queries, keys, out = layout.gathers
    assert torch.equal(queries, torch.cat([b.q_index.flatten() for b in layout.buckets]))
    assert torch.equal(keys, torch.cat([b.k_index.flatten() for b in layout.buckets]))
    real = torch.cat([b.q_valid.flatten() for b in layout.buckets])
    width = layout.width
    for i, root in enumerate(roots):
        a, b = packed.root_spans[root]
        rows = out[i * width : i * width + (b - a)]
        assert bool(real[rows].all())  # a real position reads a real query slot ...
        assert torch.equal(queries[rows], torch.arange(i * width, i * width + (b - a)))  # ... its own
        assert bool(
            (out[i * width + (b - a) : (i + 1) * width] == real.numel()).all()
        )  # padding: the zero row
    assert int(real.sum()) == sum(b - a for a, b in packed.root_spans)


def test_the_additive_mask_is_built_once_per_dtype_from_the_allowed_pairs() -> None:
    packed = build_packed(random_tree(0))
    bucket = packed.tree_layout(list(range(len(packed.root_spans))), block=3).buckets[0]
    for dtype in (torch.float32, torch.float64):
        bias = bucket.bias(dtype)
        assert bias.dtype == dtype and bias.shape == (bucket.allowed.shape[0], 1, *bucket.allowed.shape[1:])
        assert torch.equal(bias[:, 0] == 0, bucket.allowed)
        assert bool((bias[:, 0][~bucket.allowed] == torch.finfo(dtype).min).all())
        assert bucket.bias(dtype) is bias  # reused by every layer, not rebuilt
