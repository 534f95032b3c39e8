"""Tree attention: every packed token attends to its own path, and nothing else is computed.

A per-root packed row (:meth:`fr_agents.tree.batch.PackedBatch.root_chunk`) lays one root's
subtree out depth first, each node a contiguous *segment*. With a dense ``[W, W]`` mask the
attention costs ``W**2`` per root although most pairs are masked: sibling branches never see each
other. For 16 leaves that share 80% of 256 tokens, the dense row computes as many scores as the 16
unshared rows of the flat form, so only the MLPs gain from packing.

Here the row is cut into *query blocks*: up to ``block`` consecutive tokens of one segment. A
block's keys are the tokens of its segment's ancestors plus its own segment up to the block's last
token; within the own segment the mask is causal. Blocks with about the same number of keys are
stacked into one ``scaled_dot_product_attention`` call (a *bucket*, keys padded up to a multiple of
``block``). The cost is the sum over tokens of their path length, padded per bucket, instead of
``W**2`` per root. The result is the same attention, so log-probs and gradients equal the dense
mask's (and the flat form's) to round-off.

How it reaches the model: transformers' attention interface. :func:`tree_attention` registers
:func:`tree_attention_forward` under the name ``"fr_tree"`` and switches the model to it for the
duration of one forward; the :class:`TreeLayout` travels as the ``tree_layout`` keyword, which the
model passes to every attention layer. A call without a layout (another caller of the same model)
is plain ``sdpa``. Each call counts itself on the layout (``calls``), so the caller can tell whether
the model really routed the layout to its attention layers (``calls == 0``: it did not).

When it pays: a score of tree attention costs more than a score under the dense mask (the
gathers of queries, keys and values and their scatter-adds in the backward), so tree attention is
worth it only when it computes far fewer scores. :func:`tree_attention_pays` asks for at least
``TREE_MIN_SAVING`` times fewer (the dense mask's ``R * W**2`` against the layout's ``scores``).
Measured on one learner step of the tiny micro Qwen2 (fp32, 2 threads, 2 cores; median of 3-7
steps), dense mask over tree attention, time ratio by score ratio: 0.79 → 0.69, 0.90 → 1.02,
1.70–1.93 → 0.94–1.23, 2.86 → 1.16, 3.76 → 1.47, 8.5 → 2.44. Around 2x fewer scores the two
are even within the noise of such short steps, so the threshold is 2.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

NAME = "fr_tree"
BLOCK = 128  # query tokens per block, and the key padding step of a bucket
TREE_MIN_SAVING = 2.0  # tree attention when the dense mask computes at least this many times its scores


@dataclass
class Bucket:
    """Query blocks with about the same number of keys, run as one attention call.

    Indices are into the flattened ``[R * W]`` positions of a padded per-root chunk."""

    q_index: Tensor  # long [G, Bq]: the block's query positions (padding repeats a real one)
    q_valid: Tensor  # bool [G, Bq]: real query slots
    k_index: Tensor  # long [G, Ck]: the block's key positions (padding: any position, masked)
    allowed: Tensor  # bool [G, Bq, Ck]: query may attend key
    _bias: dict[torch.dtype, Tensor] = field(default_factory=dict, repr=False, compare=False)

    def to(self, device: torch.device) -> Bucket:
        return Bucket(*(t.to(device) for t in (self.q_index, self.q_valid, self.k_index, self.allowed)))

    def bias(self, dtype: torch.dtype) -> Tensor:
        """``allowed`` as sdpa's additive mask ``[G, 1, Bq, Ck]`` (0 or ``finfo(dtype).min``), built
        once per dtype: every layer of a forward and its backward reuse it instead of converting
        the boolean mask again."""
        if dtype not in self._bias:
            mask = torch.full(
                (*self.allowed.shape,), torch.finfo(dtype).min, dtype=dtype, device=self.allowed.device
            )
            self._bias[dtype] = mask.masked_fill_(self.allowed, 0.0)[:, None]
        return self._bias[dtype]


@dataclass
class TreeLayout:
    """Which packed positions each query block attends to, for one ``[R, W]`` chunk of roots."""

    rows: int
    width: int
    buckets: list[Bucket]
    calls: int = field(default=0, compare=False)  # attention layers that used this layout

    @property
    def scores(self) -> int:
        """Query x key pairs computed per head and layer (padding included): the cost measure."""
        return sum(b.allowed.numel() for b in self.buckets)

    def to(self, device: torch.device) -> TreeLayout:
        return TreeLayout(self.rows, self.width, [b.to(device) for b in self.buckets])

    @functools.cached_property
    def gathers(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every bucket's gathers as one index each: ``(queries, keys, out)``.

        ``queries`` / ``keys``: the buckets' ``q_index`` / ``k_index``, flattened and concatenated
        in bucket order. ``out[p]``: the row of the buckets' concatenated ``[G * Bq]`` outputs that
        holds position ``p``'s result, or the one past the last (a zero row) for a padding position.
        One gather per tensor and layer means one scatter-add in the backward, not one per bucket."""
        n = self.rows * self.width
        total = sum(b.q_index.numel() for b in self.buckets)
        device = self.buckets[0].q_index.device if self.buckets else torch.device("cpu")
        out = torch.full((n,), total, dtype=torch.long, device=device)
        offset = 0
        for b in self.buckets:
            real = b.q_valid.flatten()
            out[b.q_index.flatten()[real]] = torch.nonzero(real).flatten() + offset
            offset += b.q_index.numel()
        flat = [b.q_index.flatten() for b in self.buckets] or [
            torch.zeros(0, dtype=torch.long, device=device)
        ]
        keys = [b.k_index.flatten() for b in self.buckets] or [
            torch.zeros(0, dtype=torch.long, device=device)
        ]
        return torch.cat(flat), torch.cat(keys), out

    @classmethod
    def build(
        cls, segments: Sequence[Tensor], ancestors: Tensor, width: int, block: int = BLOCK
    ) -> TreeLayout:
        """The layout of rows whose token ``p`` belongs to segment ``segments[row][p]``.

        ``ancestors[s, a]`` is True when segment ``a`` is ``s`` or an ancestor of ``s``; each
        segment's tokens are contiguous and every ancestor's tokens come before them (depth-first
        order). Rows shorter than ``width`` are right-padded; padding positions get no block (their
        output is 0 and nothing reads it)."""
        if block < 1:
            raise ValueError(f"block: must be >= 1, got {block}")
        blocks: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}
        for r, seg in enumerate(segments):
            n = int(seg.numel())
            if n > width:
                raise ValueError(f"segments: row {r} has {n} tokens, more than the width {width}")
            if n == 0:
                continue
            base = r * width
            starts = [0, *(torch.nonzero(seg[1:] != seg[:-1]).flatten() + 1).tolist()]
            ends = [*starts[1:], n]
            for a, b in zip(starts, ends, strict=True):
                s = int(seg[a])
                before = torch.nonzero(ancestors[s][seg[:a]]).flatten()  # ancestor tokens, in order
                for q0 in range(a, b, block):
                    q1 = min(q0 + block, b)
                    keys = torch.cat([before, torch.arange(a, q1)])
                    # causal inside the own segment; every ancestor token is earlier than any query
                    allowed = keys[None, :] <= torch.arange(q0, q1)[:, None]
                    padded = -(-keys.numel() // block) * block
                    blocks.setdefault(padded, []).append((torch.arange(q0, q1) + base, keys + base, allowed))
        buckets = []
        for ck, group in sorted(blocks.items()):
            g, bq = len(group), max(q.numel() for q, _, _ in group)
            q_index = torch.zeros(g, bq, dtype=torch.long)
            q_valid = torch.zeros(g, bq, dtype=torch.bool)
            k_index = torch.zeros(g, ck, dtype=torch.long)
            allowed = torch.zeros(g, bq, ck, dtype=torch.bool)
            for i, (q, k, ok) in enumerate(group):
                q_index[i, : q.numel()] = q
                q_index[i, q.numel() :] = q[0]
                q_valid[i, : q.numel()] = True
                k_index[i, : k.numel()] = k
                allowed[i, : q.numel(), : k.numel()] = ok
                allowed[i, q.numel() :, 0] = True  # a padding query sees one key: no all-masked row (NaN)
            buckets.append(Bucket(q_index, q_valid, k_index, allowed))
        return cls(len(segments), width, buckets)


def tree_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tree_layout: TreeLayout | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The ``"fr_tree"`` attention: block-sparse over ``tree_layout``; plain sdpa without one.

    ``query`` is ``[R, H, W, D]``, ``key``/``value`` ``[R, Hkv, W, D]``; returns ``[R, W, H, D]``
    as transformers' attention functions do."""
    if tree_layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    r, h, w, d = query.shape
    if (r, w) != (tree_layout.rows, tree_layout.width):
        raise ValueError(
            f"tree_layout: built for [{tree_layout.rows}, {tree_layout.width}], the input is [{r}, {w}]"
        )
    hkv = key.shape[1]
    # Token-major [R * W, heads, D]: a gather of positions is one index_select along dim 0, whose
    # backward is a scatter-add (advanced indexing's backward, an accumulating index_put_, runs
    # serially on CPU and cost ~9x as much). All buckets share one gather per tensor and one
    # output gather, so the backward adds into each full-size gradient once, not once a bucket.
    q, k, v = (t.transpose(1, 2).reshape(r * w, t.shape[1], d) for t in (query, key, value))
    q_all, k_all, out_index = tree_layout.gathers
    key_sizes = [b.k_index.numel() for b in tree_layout.buckets]
    qs = q.index_select(0, q_all).split([b.q_index.numel() for b in tree_layout.buckets])
    ks, vs = (t.index_select(0, k_all).split(key_sizes) for t in (k, v))
    outs = []
    for b, qb, kb, vb in zip(tree_layout.buckets, qs, ks, vs, strict=True):
        g, bq = b.q_index.shape
        ck = b.k_index.shape[1]
        o = F.scaled_dot_product_attention(
            qb.view(g, bq, h, d).transpose(1, 2),
            kb.view(g, ck, hkv, d).transpose(1, 2),
            vb.view(g, ck, hkv, d).transpose(1, 2),
            attn_mask=b.bias(query.dtype),
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=hkv != h,
        )
        outs.append(o.transpose(1, 2).reshape(g * bq, h, d))
    outs.append(query.new_zeros(1, h, d))  # what padding positions read
    out = torch.cat(outs).index_select(0, out_index)
    tree_layout.calls += 1
    return out.view(r, w, h, d), None


def tree_attention_pays(dense_scores: int, tree_scores: int, min_saving: float = TREE_MIN_SAVING) -> bool:
    """Whether tree attention (``tree_scores`` query x key pairs, padding included) is worth its
    gathers against the dense per-root mask (``dense_scores``, ``R * W**2``): at least
    ``min_saving`` times fewer scores. ``min_saving <= 0``: always."""
    return min_saving <= 0 or dense_scores >= min_saving * tree_scores


@functools.cache
def register() -> None:
    """Make ``"fr_tree"`` known to transformers (attention and its mask builder, plain sdpa's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, tree_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def supports_tree_attention(model: Any) -> bool:
    """Whether ``model`` selects its attention through transformers' interface (so it can run
    ``"fr_tree"``), runs sdpa now (what ``"fr_tree"`` does without a layout) and has no
    sliding-window layers (tree attention sees the whole path)."""
    cfg = getattr(model, "config", None)
    return (
        cfg is not None
        and getattr(cfg, "_attn_implementation", None) == "sdpa"
        and callable(getattr(model, "set_attn_implementation", None))
        and "sliding_attention" not in (getattr(cfg, "layer_types", None) or [])
    )


@contextmanager
def tree_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with ``"fr_tree"`` attention inside the block, and its own after."""
    register()
    base = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(base)
