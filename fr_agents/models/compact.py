"""A compact training forward for Llama-family causal LMs that computes only what a step uses.

The learner needs, for rows of ``[B, W]`` token ids, the logits that predict the policy tokens and
their gradient. ``model(ids, logits_to_keep=...)`` computes more than that, and a small model on a
CPU spends most of a step in matrix products, so every product skipped is time won. This forward
reads the model's own parameters (autograd flows back into them; nothing is copied or replaced)
and skips, exactly:

* **a prefix every row shares** (a chat template's opening): its tokens go through each layer once,
  and every row's queries attend to that one copy of its keys and values;
* **the last layer's dead work**: the last layer's output is read only at the kept columns (those
  whose logits predict a policy token), so its queries, attention output, output projection and
  MLP run on those columns alone (its keys and values still cover every token);
* **each row's last column and the padding after a row**: no later token reads them;
* **the extra passes of a general implementation**: the query/key/value and gate/up projections
  run as one product each, rotary embeddings are applied to queries and keys together, and every
  linear layer sees the tokens of the whole batch as one flat matrix.

What it computes equals ``model(...)`` up to float rounding (the tests compare logits and every
parameter's gradient with transformers' forward). It runs where that is known to hold
(:func:`compact_reason` says why not otherwise): a ``Qwen2ForCausalLM`` or ``LlamaForCausalLM``
in float32 (or bfloat16, for generation), SiLU MLP, default rotary embeddings, no sliding window or
attention dropout, rows right-padded (each row's real tokens first). Everything else takes
transformers' forward.

``benchmarks/compact_forward.py`` measures it on math-tiny (figures in ``docs/measurements.md``).
The HF engine uses the same pieces for generation (:class:`CompactCache`, :func:`compact_prefill`,
:func:`compact_decode`, and :func:`opening_kv` for the opening its prompts share).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

_FAMILIES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
# float32 everywhere a gradient is taken; bfloat16 for a generation-only copy (the rollout engine's
# ``rollout.dtype``), where each product runs in bfloat16 and rotary tables are computed in float32
DTYPES = (torch.float32, torch.bfloat16)


def compact_reason(model: torch.nn.Module) -> str | None:
    """Why :func:`compact_logits` cannot stand in for ``model``'s forward, or None when it can."""
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1 or not dtypes <= set(DTYPES):
        return f"its parameters are not all of one dtype among {tuple(str(d) for d in DTYPES)}"
    reason = architecture_reason(type(model).__name__, getattr(model, "config", None))
    if reason is None and getattr(model.model, "gradient_checkpointing", False) and model.training:
        return "gradient checkpointing is on"
    return reason


def architecture_reason(architecture: str, config: Any) -> str | None:
    """The part of :func:`compact_reason` a model's class name and config decide (what a dry run
    can tell before any weights are loaded), or None when they allow the compact forward."""
    if architecture not in _FAMILIES:
        return f"{architecture} is not one of {_FAMILIES}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not 'silu'"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        return f"rotary embeddings {rope.get('rope_type')!r} are not the default kind"
    if getattr(config, "use_sliding_window", False):
        return "it uses sliding-window attention"
    if getattr(config, "pretraining_tp", 1) != 1 or getattr(config, "mlp_bias", False):
        return "pretraining_tp or mlp_bias is set"
    if getattr(config, "attention_dropout", 0.0):
        return "attention_dropout is not 0"
    return None


def _rope(
    positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """cos and sin ``[N, head_dim]`` of the default rotary embedding at ``positions`` [N], computed
    in float32 and returned in ``dtype`` (the model's)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[:, None] * inv.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of ``x`` [..., N, heads, D] with cos/sin [N, 1, D] (half-rotation layout)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Attention of ``q`` [b, H, L, D] over ``k``/``v`` [b, KV, S, D] with an additive ``mask``
    ([L, S], or [b, 1, 1, L, S] for a mask per row); query head ``h`` reads key/value head
    ``h // (H // KV)`` (grouped-query attention).

    PyTorch's fused kernel, with or without a gradient: it never holds the ``[H, L, S]`` scores,
    reads a slice of a preallocated cache in place and accumulates in float32. Generation: a decode
    step of 32 SmolLM2 rows at 1,500 cached tokens, 8.0 -> 2.9 ms a layer against two bfloat16
    products. The learner: two products kept each layer's probabilities for the backward, 4.7 GB
    for one 1,700-token ALFWorld episode through SmolLM2's 30 layers, against 0.3 GB fused (and
    ~11x less time), with gradients as close to float32's (docs/measurements.md).

    Grouped queries. The ``group`` query heads that read one key/value head are laid out as that
    head's ``group x L`` queries (row ``j * L + l`` is head ``kv * group + j`` at query ``l``, the
    mask repeated ``group`` times), so the kernel runs on the cache's ``KV`` heads as they are.
    ``enable_gqa=True`` instead expands keys and values to ``H`` heads on the CPU: a decode step
    (32 rows, 1,500 cached slots, SmolLM2's 9 query and 3 key/value heads, bfloat16, one thread)
    took 76 ms a layer that way against 11 ms grouped, where that kernel had been 71% of a held-out
    ALFWorld evaluation's generation time; the attention's forward and backward of one 1,700-token
    row 616 -> 312 ms (the learner's whole step does not change: its time is the products')."""
    b, h, length, d = q.shape
    kv = k.shape[1]
    group = h // kv
    m = (mask if mask.dim() == 2 else mask.view(b, 1, length, -1)).to(q.dtype)
    if group > 1:
        m = m.repeat(group, 1) if m.dim() == 2 else m.repeat(1, 1, group, 1)
        q = q.reshape(b, kv, group * length, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return out.view(b, h, length, d)


def _causal(rows: int, cols: int, offset: int, device: torch.device) -> Tensor:
    """Additive mask [rows, cols]: query ``i`` (at position ``offset + i``) sees keys ``<= offset + i``."""
    q = torch.arange(rows, device=device)[:, None] + offset
    k = torch.arange(cols, device=device)[None, :]
    return torch.zeros(rows, cols, device=device).masked_fill(k > q, -math.inf)


def _norm(x: Tensor, module: torch.nn.Module) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)


class CompactCache:
    """Keys and values of every layer, preallocated ``[B, KV, slots, D]``, for generation.

    Row ``b``'s tokens sit in slots ``0 .. length[b] - 1`` with no holes (prompts are right-padded
    and each generated token overwrites the slot after its row's last one), so a row attends to
    the slots below its own length and a slot past it is never read.

    A running batch that rows join and leave (the HF engine's) keeps its live rows first:
    :meth:`rows` is a view of a range of rows that prefill and decode write through, :meth:`move`
    copies finished rows' places over, and :meth:`grow` adds slots for a longer newcomer."""

    def __init__(self, model: torch.nn.Module, rows: int, slots: int, device: torch.device) -> None:
        c = model.config
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        dtype = next(model.parameters()).dtype
        # one block for every layer's keys and values, each layer's a view of it: freed whole when the
        # cache grows or ends. Per-layer tensors (tens of MB each) sat below a raised mmap threshold
        # (trainer.keep_freed_memory), so each regrowth left the old ones in the heap, where a larger
        # cache never fits: a 32-game ALFWorld evaluation grew the process by ~4 GB
        self._block = torch.zeros(
            (len(model.model.layers), 2, rows, kv_heads, slots, self.head_dim), dtype=dtype, device=device
        )
        self._views()
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)

    def _views(self) -> None:
        # the functions that write a cache (compact_prefill, compact_decode, compact_extend) run
        # without grad: a generation cache is never part of a graph
        layers = range(self._block.shape[0])
        self.keys = [self._block[i, 0] for i in layers]
        self.values = [self._block[i, 1] for i in layers]

    @property
    def slots(self) -> int:
        """Token slots per row."""
        return int(self.keys[0].shape[2])

    def rows(self, start: int, stop: int) -> CompactCache:
        """Rows ``start .. stop - 1`` as a cache of their own that shares this one's storage: what
        :func:`compact_prefill` or :func:`compact_decode` writes into it (keys, values, lengths)
        lands here."""
        view = object.__new__(CompactCache)
        view.head_dim = self.head_dim
        view.keys = [k[start:stop] for k in self.keys]
        view.values = [v[start:stop] for v in self.values]
        view.lengths = self.lengths[start:stop]
        return view

    def move(self, src: Tensor, dst: Tensor) -> None:
        """Copy rows ``src`` into the places of rows ``dst`` (the two sets disjoint): the slots
        they fill, not the whole preallocated width."""
        used = int(self.lengths[src].max())
        for k in self.keys + self.values:
            k[dst, :, :used] = k[src, :, :used]
        self.lengths[dst] = self.lengths[src]

    def grow(self, rows: int, slots: int) -> None:
        """At least ``rows`` rows of at least ``slots`` token slots, keeping every row's cached tokens."""
        rows, slots = max(rows, self.keys[0].shape[0]), max(slots, self.slots)
        if (rows, slots) == (self.keys[0].shape[0], self.slots):
            return

        old = self._block
        layers, _, had_rows, kv_heads, had_slots, head_dim = old.shape
        self._block = old.new_zeros((layers, 2, rows, kv_heads, slots, head_dim))
        self._block[:, :, :had_rows, :, :had_slots] = old
        del old
        self._views()
        lengths = self.lengths.new_zeros(rows)
        lengths[: self.lengths.shape[0]] = self.lengths
        self.lengths = lengths


def fused_weights(model: torch.nn.Module) -> list[tuple[Tensor, Tensor | None, Tensor]]:
    """Per layer, the query/key/value weight and bias and the gate/up weight concatenated as
    :func:`compact_decode` uses them: what each decode step would otherwise concatenate again
    (on a 135M model, half the parameters copied per step). Generation only (no autograd through
    them); rebuild whenever the parameters change."""
    with torch.no_grad():
        return [(*_qkv(layer.self_attn), _gate_up(layer.mlp)) for layer in model.model.layers]


def compact_logits(model: torch.nn.Module, ids: Tensor, keep: Tensor, prefix: int = 0) -> Tensor:
    """Logits ``[B, K, V]`` of ``model`` at columns ``keep`` [K] of right-padded rows ``ids`` [B, W].

    Equal, up to float rounding, to ``model(input_ids=ids, attention_mask=mask,
    logits_to_keep=keep).logits`` for any right-padding ``mask`` whose rows are real through the
    largest kept column. ``prefix``: the number of leading columns every row holds the same tokens
    in (run once); it must not exceed ``keep.min()``. ``keep`` must be sorted ascending.
    Check :func:`compact_reason` first.
    """
    if not 0 <= prefix <= int(keep[0]):
        raise ValueError(f"prefix: must be in [0, {int(keep[0])}], got {prefix}")
    b, k = ids.shape[0], keep.shape[0]
    lengths = torch.full((b,), int(keep[-1]) + 1, dtype=torch.long, device=ids.device)
    rows = torch.arange(b, device=ids.device).repeat_interleave(k)
    return _forward(model, ids, lengths, rows, keep.repeat(b), prefix).view(b, k, -1)


def compact_logits_at(
    model: torch.nn.Module, ids: Tensor, rows: Tensor, cols: Tensor, prefix: int = 0
) -> Tensor:
    """Logits ``[M, V]`` of ``model``: row ``m`` at column ``cols[m]`` of row ``rows[m]`` of the
    right-padded rows ``ids`` [B, W] (``rows`` non-decreasing, each row's columns ascending).

    What the learner asks for: a row's logits only where they predict one of its policy tokens.
    Each row runs only through its last asked column, so a batch whose replies differ in length
    computes no padding (:func:`compact_logits` runs every row to the longest). Equal, up to float
    rounding, to ``model(input_ids=ids, attention_mask=mask).logits[rows, cols]`` for a right-padding
    ``mask`` real through each row's asked columns. ``prefix``: leading columns every row holds the
    same tokens in (run once); at most ``cols.min()``. Check :func:`compact_reason` first.
    """
    return _forward(model, ids, _asked_lengths(ids, rows, cols, prefix), rows, cols, prefix)


def _asked_lengths(ids: Tensor, rows: Tensor, cols: Tensor, prefix: int) -> Tensor:
    """Each row's length through its last asked column (at least ``prefix``), after refusing asked
    columns that are missing, unsorted, repeated or outside ``ids``, or a ``prefix`` past the first."""
    b = ids.shape[0]
    if rows.numel() == 0:
        raise ValueError("rows: no column asked for")
    if not 0 <= prefix <= int(cols.min()):
        raise ValueError(f"prefix: must be in [0, {int(cols.min())}], got {prefix}")
    if bool((rows[1:] < rows[:-1]).any()) or bool(((rows[1:] == rows[:-1]) & (cols[1:] <= cols[:-1])).any()):
        raise ValueError("rows, cols: must be sorted by row, then by column, without repeats")
    if int(cols.max()) >= ids.shape[1] or int(rows.min()) < 0 or int(rows.max()) >= b:
        raise ValueError(f"rows, cols: outside ids of shape {tuple(ids.shape)}")
    lengths = torch.full((b,), prefix, dtype=torch.long, device=ids.device)
    return lengths.scatter_reduce(0, rows, cols + 1, reduce="amax")


def compact_tree_logits_at(
    model: torch.nn.Module,
    ids: Tensor,
    positions: Tensor,
    allowed: Tensor,
    rows: Tensor,
    cols: Tensor,
    prefix: int = 0,
) -> Tensor:
    """:func:`compact_logits_at` for packed tree rows: row ``b`` of ``ids`` [B, W] holds a whole
    trajectory tree (its branches side by side), token ``j`` at rotary position ``positions[b, j]``
    (its depth in the tree), attending to the keys ``allowed[b, j]`` [W] (bool: its ancestors and
    itself). Column 0 must be every real token's ancestor (the root's first token), and the first
    ``prefix`` columns a causal chain at positions ``0 .. prefix - 1`` holding the same tokens in
    every row: a prompt opening the roots share, run once. Row ``b`` runs through its last asked
    column; columns after a row's last real token must not be asked for.

    What the learner's packed step asks for: each root's logits only where they predict a policy
    token, every shared prompt computed once across roots and every shared history once within a
    root. Equal, up to float rounding, to ``model(input_ids=ids, position_ids=positions,
    attention_mask=<allowed as an additive mask>).logits[rows, cols]``. Rows that are all causal
    chains (roots of one leaf each: a linear batch) run :func:`compact_logits_at`'s forward, with
    one causal mask for every row."""
    b, w = ids.shape
    if positions.shape != (b, w) or allowed.shape != (b, w, w) or allowed.dtype != torch.bool:
        raise ValueError(
            f"positions, allowed: expected [{b}, {w}] and bool [{b}, {w}, {w}], got "
            f"{tuple(positions.shape)} and {allowed.dtype} {tuple(allowed.shape)}"
        )
    lengths = _asked_lengths(ids, rows, cols, prefix)
    if prefix:
        chain = torch.ones(prefix, prefix, dtype=torch.bool, device=ids.device).tril()
        opening = torch.arange(prefix, device=ids.device)
        if not (
            bool((ids[:, :prefix] == ids[:1, :prefix]).all())
            and bool((allowed[:, :prefix, :prefix] == chain).all())
            and bool((positions[:, :prefix] == opening).all())
        ):
            raise ValueError(
                f"prefix: the first {prefix} columns are not one causal opening every row shares"
            )
    if _causal_chains(positions, allowed):  # a linear batch: one mask serves every row
        return _forward(model, ids, lengths, rows, cols, prefix)
    return _forward(model, ids, lengths, rows, cols, prefix, positions=positions, allowed=allowed)


def _causal_chains(positions: Tensor, allowed: Tensor) -> bool:
    """Whether every row is one causal chain: its real tokens (those that see themselves) first,
    each at its column as rotary position and seeing exactly the real tokens up to itself. Such rows
    (a root with one leaf) are what :func:`compact_logits_at` computes with its one causal mask;
    a mask per row would cost the fused attention a ``[B, L, W]`` read each layer, forward and
    backward, for the same scores."""
    b, w = positions.shape
    column = torch.arange(w, device=positions.device)
    real = allowed.diagonal(dim1=1, dim2=2)  # [B, W]
    if not bool((real == (column[None] < real.sum(1, keepdim=True))).all()):
        return False  # a row with padding between real tokens
    chain = torch.ones(w, w, dtype=torch.bool, device=positions.device).tril()
    return bool(((positions == column[None]) | ~real).all()) and bool(
        (allowed == (chain[None] & real[:, :, None] & real[:, None, :])).all()
    )


@torch.no_grad()
def compact_prefill(
    model: torch.nn.Module,
    ids: Tensor,
    lengths: Tensor,
    prefix: int,
    cache: CompactCache,
    fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None,
    past: Past | None = None,
) -> Tensor:
    """Run right-padded prompts ``ids`` [B, W] (row ``b`` real in its first ``lengths[b]``
    columns, every row the same in its first ``prefix``), fill ``cache`` with their keys and
    values, and return the logits ``[B, V]`` that predict each row's next token.

    ``prefix`` must be below every length. Equal, up to float rounding, to transformers' forward
    of each prompt alone. ``fused``: :func:`fused_weights` of the current parameters, if kept.

    ``past``: keys and values already computed (:func:`opening_kv`) for tokens that come before
    ``ids`` in every row; ``ids`` then hold only what follows them (their positions run on from
    the past's length), the cache gets the past's keys and values first, and no past token is
    computed again."""
    if not 0 <= prefix < int(lengths.min()):
        raise ValueError(f"prefix: must be in [0, {int(lengths.min()) - 1}], got {prefix}")
    rows = torch.arange(ids.shape[0], device=ids.device)
    logits = _forward(model, ids, lengths, rows, lengths - 1, prefix, cache, fused, past)
    cache.lengths.copy_(lengths + (past.length if past is not None else 0))
    return logits


class Past:
    """Keys and values ``[KV, length, D]`` per layer of tokens every row of a prefill starts with
    (rotary embeddings applied at positions ``0 .. length - 1``), computed once by :func:`opening_kv`."""

    def __init__(self, keys: list[Tensor], values: list[Tensor]) -> None:
        self.keys, self.values = keys, values

    @property
    def length(self) -> int:
        """How many tokens it covers."""
        return int(self.keys[0].shape[1])

    def head(self, n: int) -> Past:
        """Its first ``n`` tokens (valid on their own: a token's keys and values depend only on
        the tokens before it)."""
        return Past([k[:, :n] for k in self.keys], [v[:, :n] for v in self.values])


@torch.no_grad()
def opening_kv(
    model: torch.nn.Module,
    ids: Tensor,
    fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None,
) -> Past:
    """The keys and values of the tokens ``ids`` [N] (N >= 1), for :func:`compact_prefill`'s ``past``."""
    cache = CompactCache(model, 1, int(ids.shape[0]), ids.device)
    last = torch.tensor([int(ids.shape[0]) - 1], device=ids.device)
    _forward(model, ids[None], last + 1, torch.zeros_like(last), last, 0, cache, fused)
    return Past([k[0] for k in cache.keys], [v[0] for v in cache.values])


@torch.no_grad()
def compact_decode(
    model: torch.nn.Module,
    tokens: Tensor,
    cache: CompactCache,
    fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None,
) -> Tensor:
    """Append one token per row (``tokens`` [B]) after each row's cached tokens and return the
    logits ``[B, V]`` that predict the next one. ``fused``: :func:`fused_weights`, if kept."""
    c = model.config
    heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, cache.head_dim
    b = tokens.shape[0]
    pos = cache.lengths.clone()
    rows = torch.arange(b, device=tokens.device)
    cos, sin = (
        t[:, None] for t in _rope(pos, head_dim, float(c.rope_parameters["rope_theta"]), cache.keys[0].dtype)
    )
    span = int(pos.max()) + 1
    mask = torch.zeros(b, span, device=tokens.device).masked_fill(
        torch.arange(span, device=tokens.device)[None] > pos[:, None], -math.inf
    )[:, None, None, None]
    x = F.embedding(tokens, model.model.embed_tokens.weight)  # [B, C]
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        weight, bias, gate_up = fused[i] if fused is not None else (*_qkv(attn), None)
        qkv = F.linear(_norm(x, layer.input_layernorm), weight, bias).view(b, heads + 2 * kv_heads, head_dim)
        qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)
        cache.keys[i][rows, :, pos] = qk[:, heads:]
        cache.values[i][rows, :, pos] = qkv[:, heads + kv_heads :]
        q = qk[:, :heads, None]  # [B, H, 1, D]
        out = _attend(q, cache.keys[i][:, :, :span], cache.values[i][:, :, :span], mask)
        x = x + F.linear(out.reshape(b, heads * head_dim), attn.o_proj.weight, attn.o_proj.bias)
        x = x + _mlp(_norm(x, layer.post_attention_layernorm), mlp, gate_up)
    cache.lengths += 1
    x = _norm(x, model.model.norm)
    return F.linear(x, model.lm_head.weight, getattr(model.lm_head, "bias", None))


@torch.no_grad()
def compact_extend(
    model: torch.nn.Module,
    ids: Tensor,
    lengths: Tensor,
    cache: CompactCache,
    fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None,
) -> Tensor:
    """Append right-padded tokens ``ids`` [B, W] (row ``b`` real in its first ``lengths[b]``
    columns) after each row's cached tokens, which may differ in number from row to row, and
    return the logits ``[B, V]`` that predict each row's next token.

    What :func:`compact_decode` does for one token a row, for several: the HF engine continues
    finished rows this way (each with the kept keys and values of its own history already in its
    row of ``cache``), all of a join's rows in one forward. Equal, up to float rounding, to
    prefilling each row's whole sequence."""
    c = model.config
    heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, cache.head_dim
    b, width = ids.shape
    device = ids.device
    start = cache.lengths.clone()  # [B] each row's cached tokens
    column = torch.arange(width, device=device)
    real = column[None] < lengths[:, None]  # [B, W]
    row_of, col_of = real.nonzero(as_tuple=True)  # each real token's row and column, row-major
    pos = start[row_of] + col_of  # its position
    cos, sin = (
        t[:, None] for t in _rope(pos, head_dim, float(c.rope_parameters["rope_theta"]), cache.keys[0].dtype)
    )
    span = int((start + lengths).max())
    # query (b, j) at position start[b] + j sees the keys at positions <= its own
    visible = torch.arange(span, device=device)[None, None] <= (start[:, None] + column[None])[:, :, None]
    mask = torch.zeros(b, 1, width, span, device=device).masked_fill(~visible[:, None], -math.inf)
    flat = row_of * width + col_of  # each real token's slot in the padded [B * W] layout
    x = F.embedding(ids[row_of, col_of], model.model.embed_tokens.weight)  # [N, C]
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        weight, bias, gate_up = fused[i] if fused is not None else (*_qkv(attn), None)
        qkv = F.linear(_norm(x, layer.input_layernorm), weight, bias).view(-1, heads + 2 * kv_heads, head_dim)
        qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)
        cache.keys[i][row_of, :, pos] = qk[:, heads:]
        cache.values[i][row_of, :, pos] = qkv[:, heads + kv_heads :]
        q = qk.new_zeros((b * width, heads, head_dim)).index_copy(0, flat, qk[:, :heads])
        q = q.view(b, width, heads, head_dim).transpose(1, 2)  # [B, H, W, D]
        out = _attend(q, cache.keys[i][:, :, :span], cache.values[i][:, :, :span], mask[:, None])
        out = out.transpose(1, 2).reshape(b * width, heads * head_dim).index_select(0, flat)
        x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
        x = x + _mlp(_norm(x, layer.post_attention_layernorm), mlp, gate_up)
    cache.lengths += lengths
    last = torch.cumsum(lengths, 0) - 1  # each row's last real token among the flat ones
    x = _norm(x[last], model.model.norm)
    return F.linear(x, model.lm_head.weight, getattr(model.lm_head, "bias", None))


def _qkv(attn: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """The query, key and value projections as one weight (and bias)."""
    weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    if attn.q_proj.bias is None:
        return weight, None
    return weight, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])


def _gate_up(mlp: torch.nn.Module) -> Tensor:
    """The MLP's gate and up projections as one weight."""
    return torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])


def _mlp(h: Tensor, mlp: torch.nn.Module, gate_up: Tensor | None = None) -> Tensor:
    gate, up = F.linear(h, _gate_up(mlp) if gate_up is None else gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, mlp.down_proj.weight)


def _forward(
    model: torch.nn.Module,
    ids: Tensor,
    lengths: Tensor,
    keep_rows: Tensor,
    keep_cols: Tensor,
    prefix: int,
    cache: CompactCache | None = None,
    fused: list[tuple[Tensor, Tensor | None, Tensor]] | None = None,
    past: Past | None = None,
    positions: Tensor | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """Logits ``[M, V]``, row ``m`` at column ``keep_cols[m]`` of row ``keep_rows[m]`` (rows
    non-decreasing; each column at or after ``prefix`` and below its row's length), of right-padded
    rows ``ids`` [B, W]: row ``b`` runs its first ``lengths[b]`` columns (>= ``prefix``), whose
    first ``prefix`` are the same in every row. With ``cache``, every layer's keys and values of all
    columns also go into it (slots past a row's length hold nothing meaningful). With ``past``,
    every row is preceded by the past's tokens: ``ids``' positions start at its length, every query
    also attends to its keys, and ``cache`` holds them before the columns of ``ids``.

    Only real tokens go through the products: the shared prefix once, then each row's own columns
    up to its length (padding is never computed). Attention alone lays the rows out padded to the
    longest, ``[B, rest]``, since each row attends within itself; a padding slot sits after every
    real query of its row, so the causal mask already hides it.

    Tree rows (:func:`compact_tree_logits_at`, without ``cache`` or ``past``): ``positions`` [B, W]
    replace the column index as rotary positions, and ``allowed`` [B, W, W] (bool) replaces the
    causal mask after the prefix, one per row."""
    if allowed is not None and (cache is not None or past is not None):
        raise ValueError("allowed: tree rows are a training forward (no cache, no past)")
    b = ids.shape[0]
    c = model.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    device = ids.device
    before = past.length if past is not None else 0  # tokens in the cache before column 0
    own = lengths - prefix  # [B] each row's columns after the shared prefix
    rest = int(own.max())
    width = prefix + rest

    # every real token as one flat matrix: the shared prefix once, then each row's own columns.
    # ``real``: each own token's slot in the padded [B * rest] layout; ``slot_of``: each padded
    # slot's place among the own tokens (read only at real slots).
    column = torch.arange(rest, device=device)
    real = (column[None] < own[:, None]).reshape(-1).nonzero().squeeze(1)
    slot_of = torch.zeros(b * rest, dtype=torch.long, device=device)
    slot_of[real] = torch.arange(real.shape[0], device=device)
    tokens = torch.cat([ids[0, :prefix], ids[:, prefix:width].reshape(-1)[real]])
    if positions is None:
        at = before + torch.cat([torch.arange(prefix, device=device), (prefix + column).repeat(b)[real]])
    else:
        at = torch.cat([positions[0, :prefix], positions[:, prefix:width].reshape(-1)[real]])
    cos, sin = (
        t[:, None]
        for t in _rope(
            at, head_dim, float(c.rope_parameters["rope_theta"]), model.model.embed_tokens.weight.dtype
        )
    )
    prefix_mask = _causal(prefix, before + prefix, before, device)
    if allowed is None:
        rest_mask = _causal(rest, before + width, before + prefix, device)
    else:  # one mask per row; column 0 (every token's ancestor) keeps a padding query's row finite
        sees = allowed[:, prefix:width, :width].clone()
        sees[:, :, 0] = True
        rest_mask = torch.zeros(sees.shape, device=device).masked_fill(~sees, -math.inf)  # [B, rest, W]

    # the kept queries: their place among all tokens, and a padded [B, kept] layout for attention
    count = torch.bincount(keep_rows, minlength=b)
    kept = int(count.max())
    rank = torch.arange(keep_rows.shape[0], device=device) - (torch.cumsum(count, 0) - count)[keep_rows]
    keep_slot = keep_rows * kept + rank  # [M] in the padded [B * kept] layout
    flat_keep = prefix + slot_of[keep_rows * rest + keep_cols - prefix]  # [M] among all tokens
    keep_cos, keep_sin = cos[flat_keep], sin[flat_keep]
    keep_at = torch.full((b * kept,), prefix, dtype=torch.long, device=device)
    keep_at[keep_slot] = keep_cols
    if allowed is None:
        keep_mask = rest_mask[keep_at.view(b, kept) - prefix][:, None, None]  # [B, 1, 1, kept, before + W]
    else:
        keep_mask = rest_mask.gather(1, (keep_at.view(b, kept) - prefix)[:, :, None].expand(-1, -1, width))

    def padded(t: Tensor, slots: Tensor, per_row: int) -> Tensor:
        """Rows of ``t`` [N, ...] put at ``slots`` [N] of a zero [B, per_row, ...] layout."""
        return t.new_zeros((b * per_row, *t.shape[1:])).index_copy(0, slots, t).view(b, per_row, *t.shape[1:])

    def shared_kv(t: Tensor, old: Tensor | None) -> Tensor | None:
        """Keys or values [KV, before + prefix, D] every row reads (the past's, then the prefix's),
        or None when there are none."""
        if not prefix:
            return old
        mine = t[:prefix].transpose(0, 1)
        return mine if old is None else torch.cat([old, mine], dim=1)

    def rows(t: Tensor, shared: Tensor | None) -> Tensor:
        """Keys or values [N, KV, D] as [b, KV, before + prefix + rest, D]: the ``shared`` ones
        once, broadcast to every row."""
        mine = padded(t[prefix:], real, rest).transpose(1, 2)
        if shared is None:
            return mine
        return torch.cat([shared.unsqueeze(0).expand(b, -1, -1, -1), mine], dim=2)

    x = F.embedding(tokens, model.model.embed_tokens.weight)  # [N, C]
    layers = model.model.layers
    q_size = heads * head_dim
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        last = i == len(layers) - 1
        h = _norm(x, layer.input_layernorm)
        weight, bias, gate_up = fused[i] if fused is not None else (*_qkv(attn), None)
        if last:  # keys and values for every token, queries at the kept columns only
            kv = F.linear(h, weight[q_size:], None if bias is None else bias[q_size:])
            q = F.linear(h[flat_keep], weight[:q_size], None if bias is None else bias[:q_size])
            q = _rotate(q.view(-1, heads, head_dim), keep_cos, keep_sin)
            k, v = kv.view(-1, 2 * kv_heads, head_dim).split(kv_heads, dim=1)
            k = _rotate(k, cos, sin)
        else:
            qkv = F.linear(h, weight, bias).view(-1, heads + 2 * kv_heads, head_dim)
            qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        old_k, old_v = (past.keys[i], past.values[i]) if past is not None else (None, None)
        shared_k, shared_v = shared_kv(k, old_k), shared_kv(v, old_v)
        keys, values = rows(k, shared_k), rows(v, shared_v)
        if cache is not None:
            cache.keys[i][:, :, : before + width] = keys
            cache.values[i][:, :, : before + width] = values
        if last:
            q_rows = padded(q, keep_slot, kept).transpose(1, 2)
            out = (
                _attend(q_rows, keys, values, keep_mask)
                .transpose(1, 2)
                .reshape(b * kept, q_size)
                .index_select(0, keep_slot)
            )
            x = x[flat_keep]
        else:
            q_rows = padded(q[prefix:], real, rest).transpose(1, 2)
            out = (
                _attend(q_rows, keys, values, rest_mask)
                .transpose(1, 2)
                .reshape(b * rest, q_size)
                .index_select(0, real)
            )
            if prefix:
                q_pre = q[:prefix].transpose(0, 1).unsqueeze(0)
                k_pre, v_pre = shared_k.unsqueeze(0), shared_v.unsqueeze(0)
                out_pre = _attend(q_pre, k_pre, v_pre, prefix_mask)[0].transpose(0, 1).reshape(prefix, q_size)
                out = torch.cat([out_pre, out])
        x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
        x = x + _mlp(_norm(x, layer.post_attention_layernorm), layer.mlp, gate_up)
    x = _norm(x, model.model.norm)
    return F.linear(x, model.lm_head.weight, getattr(model.lm_head, "bias", None))
