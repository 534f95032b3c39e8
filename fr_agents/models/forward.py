"""The policy's log-probs for one chunk of a batch: every way the learner runs the model, in one place.

A learner step runs the model chunk by chunk: a few rows of a flat batch (:class:`FlatChunk`, cut
to their longest real row) or a few roots of a tree-packed batch (:class:`PackedChunk`, one padded
row per root). One call, :meth:`PolicyForward.logprobs`, returns the current policy's log-prob of
every token of the chunk's rows at the sampling temperature (and, when the loss asks, the entropy
of each prediction)::

    policy = PolicyForward(model, ForwardConfig(temperature=0.7))
    out = policy.logprobs(FlatChunk(batch, rows), device)    # out.log_probs: [rows, width]

Which forward runs is decided here; all give the same log-probs and gradients (tested):

* flat rows: the compact forward (:func:`policy_token_logits`, through
  :func:`fr_agents.models.compact.compact_logits_at`: each row only through its last policy token,
  the output head only where a logit predicts one) where
  :func:`~fr_agents.models.compact.compact_reason` allows and the rows are right-padded; else
  transformers' forward with a prefix every row shares run once and the output head only on the
  columns that can hold a policy token (:func:`policy_logits`); else, for a model that takes
  neither, the plain forward.
* packed roots: the compact forward's tree rows (:meth:`PolicyForward._packed_compact`, through
  :func:`fr_agents.models.compact.compact_tree_logits_at`: the opening the roots share once, each
  root's tree once, one boolean ancestor mask per root) where :func:`~fr_agents.models.compact.compact_reason`
  allows; else transformers' forward with block-sparse tree attention (:mod:`fr_agents.tree.attention`)
  where it computes at least ``tree_min_saving`` times fewer scores than a dense mask (wide rows of
  many branches), or one float ``[W, W]`` ancestor-causal mask per root (also once a model is found to
  drop the tree keyword); without ``logits_to_keep`` for a model whose forward lacks it.

``ForwardConfig.autocast`` (``trainer.autocast``) runs the model call, and only it, under
``torch.autocast``: parameters, gradients and the optimizer keep their dtype, the log-softmax runs
in the objective's precision and the backward outside the context, as torch asks.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from fr_agents.config import AUTOCAST_DTYPES
from fr_agents.models.compact import compact_logits_at, compact_reason, compact_tree_logits_at
from fr_agents.tree.attention import (
    TREE_MIN_SAVING,
    supports_tree_attention,
    tree_attention,
    tree_attention_pays,
)
from fr_agents.tree.batch import FlatBatch, PackedBatch, token_logprobs

logger = logging.getLogger(__name__)

Tensor = torch.Tensor


@dataclass
class ForwardConfig:
    """How the learner runs its policy.

    Args:
        temperature: the sampling temperature the rollouts used (log-probs are recomputed at it,
            so the importance ratio compares like with like).
        compact_forward: flat chunks take the compact forward where it applies; False:
            transformers' forward always.
        tree_attention: packed chunks may take tree attention when the model supports it
            (:func:`~fr_agents.tree.attention.supports_tree_attention`); False: the dense mask.
        tree_min_saving: a chunk of roots takes tree attention only when the dense mask would
            compute at least this many times its scores (<= 0: whenever the model supports it).
        autocast: ``"bfloat16"``: the model call runs under ``torch.autocast``; ``""``: off.
    """

    temperature: float = 1.0
    compact_forward: bool = True
    tree_attention: bool = True
    tree_min_saving: float = TREE_MIN_SAVING
    autocast: str = ""

    def check(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature: must be > 0, got {self.temperature!r}")
        if self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast: expected one of {AUTOCAST_DTYPES}, got {self.autocast!r}")


@dataclass
class FlatChunk:
    """Rows ``rows`` of a flat batch (one micro-batch)."""

    batch: FlatBatch
    rows: Tensor


@dataclass
class PackedChunk:
    """Roots ``roots`` of a tree-packed batch (one per-root forward)."""

    batch: PackedBatch
    roots: list[int]


@dataclass
class ChunkLogprobs:
    """What one chunk's forward gives the objective.

    ``log_probs[i, t]`` is the current log-prob of token ``t`` of batch row ``rows[i]``, for the
    first ``width`` columns (0 where nothing was computed: prompts, padding); ``action_mask`` is
    those rows' policy tokens over the same columns; ``entropies`` (same shape, no gradient) only
    when asked for. ``forward_tokens``: the token slots the model ran; ``tree_attention``: whether
    it ran tree attention.
    """

    rows: Tensor
    width: int
    log_probs: Tensor
    action_mask: Tensor
    entropies: Tensor | None
    forward_tokens: int
    tree_attention: bool = False


def _entropy(scaled: Tensor) -> Tensor:
    """Entropy of ``softmax(scaled)`` along the last axis (no gradient)."""
    with torch.no_grad():
        logp = torch.log_softmax(scaled, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)


def shared_prefix(ids: Tensor, attn: Tensor, limit: int) -> int:
    """How many leading columns (at most ``limit``) hold the same real token in every row."""
    same = ((ids == ids[:1]) & attn).all(dim=0)[:limit]
    if bool(same.all()):
        return int(same.shape[0])
    return int(torch.argmin(same.to(torch.int8)))


def policy_logits(
    model: torch.nn.Module, ids: Tensor, attn: Tensor, action_mask: Tensor
) -> tuple[int, Tensor]:
    """The logits a step needs for rows ``ids`` [B, W] through transformers' forward: ``(first,
    logits)`` where ``logits[:, j]`` predicts column ``first + j`` and ``first`` is the first
    column holding a policy token.

    Two exact savings over ``model(ids).logits``, both of which leave the loss and its gradient
    unchanged (tested against the plain forward):

    * **only the columns that can hold a policy token** go through the output head (most of a
      row is prompt and observation; the head and its log-softmax are a large share of a small
      model's work);
    * **a prefix every row shares** (a chat template's opening, a system prompt) is run once, as
      a one-row forward whose key/value cache is repeated for the batch; autograd sums the rows'
      gradients back through the repeat. The prefix stops before the first policy token.

    A model the compact forward takes goes through :func:`policy_token_logits` instead.
    A model without ``logits_to_keep`` or a repeatable cache gets the plain forward. A float64
    model never shares the prefix: float64 is the reference precision of the equality tests, and
    transformers' RMSNorm computes in float32, so summing the rows' gradients before it instead
    of after it moves a float64 gradient by ~1e-9 (a float32 one by less than its own rounding).
    """
    b, w = ids.shape
    cols = action_mask.any(dim=0).nonzero()
    first = int(cols[0]) if cols.numel() else w - 1
    first = max(1, first)
    keep = torch.arange(first - 1, w - 1, device=ids.device)
    exact = next(model.parameters()).dtype == torch.float64
    prefix = shared_prefix(ids, attn, first - 1) if b > 1 and not exact else 0
    try:
        if prefix >= 2:
            head = model(input_ids=ids[:1, :prefix], use_cache=True, logits_to_keep=1)
            cache = head.past_key_values
            if hasattr(cache, "batch_repeat_interleave"):
                cache.batch_repeat_interleave(b)
                positions = torch.arange(prefix, w, device=ids.device)
                out = model(
                    input_ids=ids[:, prefix:],
                    attention_mask=attn.long(),
                    past_key_values=cache,
                    position_ids=positions.expand(b, -1),
                    cache_position=positions,
                    logits_to_keep=keep - prefix,
                    use_cache=False,
                )
                return first, out.logits
        out = model(input_ids=ids, attention_mask=attn.long(), logits_to_keep=keep)
        return first, out.logits
    except TypeError:  # a model whose forward takes neither
        return first, model(input_ids=ids, attention_mask=attn.long()).logits[:, first - 1 : w - 1]


def policy_token_logits(
    model: torch.nn.Module, ids: Tensor, attn: Tensor, action_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The logits a step needs for right-padded rows ``ids`` [B, W] through the compact forward
    (:func:`~fr_agents.models.compact.compact_logits_at`; check
    :func:`~fr_agents.models.compact.compact_reason` first): ``(rows, cols, logits)`` where
    ``logits[m]`` [M, V] is row ``rows[m]``'s at column ``cols[m]``, which predicts the policy
    token at ``cols[m] + 1``, for every policy token after column 0.

    Only those columns reach the output head, and each row runs only through its last one: in a
    batch of replies of different lengths no padding is computed (most of a step, when one reply
    runs to the token limit and the rest stop early). The prefix every row shares runs once.
    """
    rows, cols = action_mask[:, 1:].nonzero(as_tuple=True)
    prefix = shared_prefix(ids, attn, int(cols.min())) if ids.shape[0] > 1 and rows.numel() else 0
    return rows, cols, compact_logits_at(model, ids, rows, cols, prefix if prefix >= 2 else 0)


def _tokens_ran(prefix: int, rows: Tensor, cols: Tensor, n_rows: int) -> int:
    """Tokens a compact forward runs: the shared ``prefix`` once, then each of ``n_rows`` rows through
    its last asked column (``rows``/``cols``: the asked positions)."""
    ends = torch.full((n_rows,), prefix, dtype=torch.long, device=rows.device)
    return prefix + int((ends.scatter_reduce(0, rows, cols + 1, reduce="amax") - prefix).sum())


class PolicyForward:
    """The learner's model behind one call, :meth:`logprobs` (see the module docstring).

    ``compact_reason`` is None when flat chunks take the compact forward, else why not;
    ``tree_attention`` is whether packed chunks may take tree attention (it turns False, with a
    warning, once the model is seen to drop the attention keyword).
    """

    def __init__(self, model: torch.nn.Module, config: ForwardConfig) -> None:
        config.check()
        self.model = model
        self.config = config
        self.tree_attention = config.tree_attention and supports_tree_attention(model)
        self.compact_reason = (
            compact_reason(model) if config.compact_forward else "model.compact_forward is false"
        )
        if self.compact_reason is None:
            logger.info(
                "learner: flat and tree-packed steps run the compact forward (fr_agents.models.compact)"
            )
        else:
            logger.info("learner: transformers' forward (no compact forward: %s)", self.compact_reason)

    def autocast_context(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """The forward's products in ``config.autocast``'s dtype (``trainer.autocast``); parameters,
        their gradients and the optimizer stay in theirs, and the backward runs outside (as torch asks)."""
        if not self.config.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=getattr(torch, self.config.autocast))

    def scale(self, logits: Tensor) -> Tensor:
        """Logits at the sampling temperature, in the objective's precision (float64 stays float64,
        anything else float32; no division at 1)."""
        logits = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        t = self.config.temperature
        return logits if t == 1.0 else logits / t

    def logprobs(
        self, chunk: FlatChunk | PackedChunk, device: torch.device, entropies: bool = False
    ) -> ChunkLogprobs:
        """The current log-probs of ``chunk``'s rows (and their entropies when ``entropies``)."""
        if isinstance(chunk, PackedChunk):
            return self._packed(chunk.batch, chunk.roots, device, entropies)
        return self._flat(chunk.batch, chunk.rows, device, entropies)

    # ----------------------------------------------------------------------- flat rows

    def _flat(self, flat: FlatBatch, rows: Tensor, device: torch.device, entropies: bool) -> ChunkLogprobs:
        """One forward over ``rows``, trimmed to their longest real row."""
        am = flat.attention_mask[rows]
        width = int((torch.arange(1, am.shape[1] + 1) * am.cpu()).max())
        ids = flat.token_ids[rows, :width].to(device)
        attn = am[:, :width].to(device)
        action_mask = flat.action_mask[rows, :width].to(device)
        if (
            self.compact_reason is None
            and bool((attn[:, 1:] <= attn[:, :-1]).all())
            and bool(action_mask[:, 1:].any())
        ):
            return self._flat_compact(rows, ids, attn, action_mask, device, entropies)
        with self.autocast_context(device):
            first, logits = policy_logits(self.model, ids, attn, action_mask)
        scaled = self.scale(logits)  # predicts columns first..width-1
        lp = torch.zeros(ids.shape, dtype=scaled.dtype, device=device)
        lp = torch.cat([lp[:, :first], token_logprobs(scaled, ids[:, first:])], dim=1)
        ent = None
        if entropies:
            ent = torch.cat([torch.zeros_like(lp[:, :first]), _entropy(scaled)], dim=1).detach()
        return ChunkLogprobs(rows, width, lp, action_mask, ent, ids.numel())

    def _flat_compact(
        self,
        rows: Tensor,
        ids: Tensor,
        attn: Tensor,
        action_mask: Tensor,
        device: torch.device,
        entropies: bool,
    ) -> ChunkLogprobs:
        """The compact forward of right-padded rows: logits only where they predict a policy token."""
        with self.autocast_context(device):
            at_rows, at_cols, logits = policy_token_logits(self.model, ids, attn, action_mask)
        scaled = self.scale(logits)  # [M, V]
        where = (at_rows, at_cols + 1)
        lp = torch.zeros(ids.shape, dtype=scaled.dtype, device=device).index_put(
            where, token_logprobs(scaled, ids[where])
        )
        ent = None
        if entropies:
            ent = torch.zeros(ids.shape, dtype=scaled.dtype, device=device).index_put(where, _entropy(scaled))
        # the tokens it ran: the shared prefix once, then each row through its last asked column
        prefix = shared_prefix(ids, attn, int(at_cols.min())) if ids.shape[0] > 1 else 0
        prefix = prefix if prefix >= 2 else 0
        return ChunkLogprobs(
            rows, ids.shape[1], lp, action_mask, ent, _tokens_ran(prefix, at_rows, at_cols, ids.shape[0])
        )

    # ----------------------------------------------------------------------- packed roots

    def _packed(
        self, batch: PackedBatch, roots: list[int], device: torch.device, entropies: bool
    ) -> ChunkLogprobs:
        """One forward over the packed tokens of ``roots`` (one padded row per root, each token
        attending to its own path); per-leaf log-probs are gathered from the flattened logits."""
        if self.compact_reason is None:
            out = self._packed_compact(batch, roots, device, entropies)
            if out is not None:
                return out
        flat = batch.flat
        dtype = next((p.dtype for p in self.model.parameters() if p.requires_grad), torch.float32)
        layout = self._tree_layout(batch, roots)
        part = batch.root_chunk(roots, dtype, dense_mask=layout is None)
        rows, width = part["rows"], part["input_ids"].shape[1]
        # the output head runs only on the columns whose logits predict a policy token of some row
        # (as the flat path's policy_logits does); ``prev`` is re-indexed into those columns
        prev = part["prev"]
        keep = torch.unique(prev[flat.action_mask[rows]] % width)
        keep = keep if keep.numel() else torch.zeros(1, dtype=torch.long)
        column = torch.full((width,), -1, dtype=torch.long)
        column[keep] = torch.arange(keep.numel())
        kept = column[prev % width] >= 0  # [b, T]: tokens whose log-prob is computed
        prev = ((prev // width) * keep.numel() + column[prev % width].clamp(min=0)).to(device)
        with self.autocast_context(device):
            out, used_tree = self._packed_forward(batch, roots, part, layout, keep.to(device), dtype, device)
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        scaled = self.scale(logits)  # [R*K, V]
        lp = token_logprobs(scaled, flat.token_ids[rows].to(device), prev)  # [b, T]
        valid = flat.attention_mask[rows].to(device) & kept.to(device)
        valid[:, 0] = False
        lp = lp * valid
        ent = _entropy(scaled)[prev] if entropies else None
        action_mask = flat.action_mask[rows].to(device)
        return ChunkLogprobs(rows, lp.shape[1], lp, action_mask, ent, part["input_ids"].numel(), used_tree)

    def _packed_compact(
        self, batch: PackedBatch, roots: list[int], device: torch.device, entropies: bool
    ) -> ChunkLogprobs | None:
        """The compact forward of packed roots (:func:`~fr_agents.models.compact.compact_tree_logits_at`):
        the prompt opening the roots share runs once, each root's tree once (every shared turn of its
        branches one time), each root only through its last column that predicts a policy token, and
        the output head only there. None when no token of these roots is a policy token."""
        flat = batch.flat
        part = batch.root_chunk(roots, dense_mask=False)
        ids, pos = part["input_ids"].to(device), part["position_ids"].to(device)
        allowed = batch.ancestor_mask(roots).to(device)
        rows, prev = part["rows"], part["prev"]  # prev: [b, T] into the flattened [R * W]
        n_roots, width = ids.shape
        action_mask = flat.action_mask[rows]
        need = torch.unique(prev[action_mask])  # sorted: by root, then by column
        if need.numel() == 0:
            return None
        at_rows, at_cols = need // width, need % width
        prefix = 0
        if n_roots > 1:
            real = torch.tensor([b - a for a, b in (batch.root_spans[r] for r in roots)])
            real = torch.arange(width)[None] < real[:, None]
            prefix = shared_prefix(ids, real.to(device), int(at_cols.min()))
            # ... and a causal chain at positions 0.. in every root (a root's prompt, then its first branch)
            head = allowed[:, :prefix, :prefix]
            opening = torch.arange(prefix, device=device)
            chain = (
                (head.sum(dim=2) == opening + 1)
                & head.diagonal(dim1=1, dim2=2)
                & (pos[:, :prefix] == opening)
            )
            broken = (~chain.all(dim=0)).nonzero()
            prefix = int(broken[0]) if broken.numel() else prefix
            prefix = prefix if prefix >= 2 else 0
        with self.autocast_context(device):
            logits = compact_tree_logits_at(
                self.model, ids, pos, allowed, at_rows.to(device), at_cols.to(device), prefix
            )
        scaled = self.scale(logits)  # [M, V]: row m predicts the token after packed index need[m]
        index = torch.zeros(n_roots * width, dtype=torch.long)
        index[need] = torch.arange(need.numel())
        at = index[prev].to(device)  # [b, T]: the logits row predicting each token
        action_mask = action_mask.to(device)
        lp = token_logprobs(scaled, flat.token_ids[rows].to(device), at) * action_mask
        ent = (_entropy(scaled)[at] * action_mask) if entropies else None
        ran = _tokens_ran(prefix, at_rows, at_cols, n_roots)
        return ChunkLogprobs(rows, lp.shape[1], lp, action_mask, ent, ran)

    def _tree_layout(self, batch: PackedBatch, roots: list[int]) -> Any:
        """The tree-attention layout of a chunk of roots, or None when the chunk takes the dense
        per-root mask: the model cannot run tree attention, or it would not save
        ``tree_min_saving`` times the dense mask's scores (the exact count of allowed pairs
        rules most short chunks out before any layout is built)."""
        if not self.tree_attention:
            return None
        saving = float(self.config.tree_min_saving)
        dense = len(roots) * batch.chunk_width(roots) ** 2
        if not tree_attention_pays(dense, batch.attention_pairs(roots), saving):
            return None
        layout = batch.tree_layout(roots)
        return layout if tree_attention_pays(dense, layout.scores, saving) else None

    def _packed_forward(
        self,
        batch: PackedBatch,
        roots: list[int],
        part: dict[str, Tensor],
        layout: Any,
        keep: Tensor,
        dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[Any, bool]:
        """The model's output (logits of the ``keep`` columns) for one chunk of roots, and whether
        it ran tree attention: over ``layout`` when there is one, else the dense per-root mask of
        ``part`` (built here if missing)."""
        inputs = {
            "input_ids": part["input_ids"].to(device),
            "position_ids": part["position_ids"].to(device),
            "logits_to_keep": keep,
        }
        if layout is not None:
            layout = layout.to(device)
            with tree_attention(self.model):
                out = self.model(**inputs, tree_layout=layout)
            if layout.calls:
                return out, True
            # the model dropped the keyword, so that forward was plain causal attention: discard it
            logger.warning(
                "%s does not pass attention keywords to its layers; packed steps use the dense mask",
                type(self.model).__name__,
            )
            self.tree_attention = False
            part = batch.root_chunk(roots, dtype)
        mask = part["attention_mask"].to(device)
        try:
            return self.model(**inputs, attention_mask=mask), False
        except TypeError:  # a model whose forward takes no logits_to_keep: keep the columns here
            del inputs["logits_to_keep"]
            out = self.model(**inputs, attention_mask=mask)
            out.logits = out.logits[:, keep]
            return out, False
