"""What the learner receives: flat ``[B, T]`` tensors, or one tree-packed row.

Flat form (:class:`FlatBatch`): one right-padded row per trajectory. Token ``t`` of row ``i`` is
predicted by the logits at ``t-1`` of the same row.

Tree-packed form (:class:`PackedBatch`): the union of the B paths' nodes laid out once, depth
first (every ancestor before its descendants), as a single sequence of N tokens. Each packed
token gets the position it has on its own path, and may attend exactly to the tokens of its path
up to itself. That is a 4-D *float additive* mask (0 where allowed, ``finfo(dtype).min`` elsewhere):
a bool 4-D mask is silently wrong under transformers' eager attention. ``prev_index[i, t]`` is
the packed index whose logits predict token ``t`` of leaf ``i``, so one forward over N tokens
gives every leaf's log-probs; shared prefixes are computed once and, because the objective only
reads per-leaf gathered log-probs, its value and gradients equal the flat form's.

Per-root packing. Paths of different roots share nothing, so the packed layout keeps each root's
subtree contiguous (``root_spans``) and the learner runs roots as separate rows of a padded
``[R, W]`` input (:meth:`PackedBatch.root_chunk`), each with its own ``[W, W]`` mask: attention
memory grows with the sum over roots of their packed size squared, never with the square of the
whole batch, and :meth:`PackedBatch.root_chunks` splits the roots by a token budget like flat
micro-batches. The whole-batch ``[N, N]`` mask (:meth:`PackedBatch.attention_mask`) remains for
small checks only.

Rewards: ``reward="env"`` uses the env reward, ``"partial"`` the partial score of unfinished
(truncated/aborted) leaves that have one, ``"progress"`` that score too, paid only to the replies up
to the one after which it first reached its best: ``credit_ends[i]`` is where row ``i``'s reward stops paying
(:meth:`~fr_agents.tree.nodes.Trajectory.credit_end`; the advantages in ``trainer/objective.py``).
``failures[i]`` is True when leaf ``i`` did not finish normally (status truncated/aborted) or its env
reward is <= 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

import numpy as np
import torch
from torch import Tensor

from fr_agents.tree.attention import BLOCK, TreeLayout
from fr_agents.tree.nodes import Trajectory


def token_logprobs(logits: Tensor, targets: Tensor, rows: Tensor | None = None) -> Tensor:
    """``log_softmax(logits)`` at ``targets``, without materialising the full log-softmax.

    The one log-prob gather of the project (both batch forms and the learner use it).
    ``rows=None``: ``logits[..., V]`` predicts ``targets[...]`` position by position. With
    ``rows`` (the packed form): ``logits`` is ``[N, V]`` and ``logits[rows[i, t]]`` predicts
    ``targets[i, t]``, so each row's log-sum-exp is computed once however many targets share it.
    """
    lse = torch.logsumexp(logits, dim=-1)
    if rows is None:
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    return logits[rows, targets] - lse[rows]


BatchKind: TypeAlias = Literal["flat", "packed"]


@dataclass
class FlatBatch:
    """Padded per-trajectory tensors (pad token 0, right padding).

    ``kind`` is ``"flat"``: the class attribute that tells the two batch forms apart (see
    :data:`TrainBatch` and :func:`flat_view`).
    """

    kind: ClassVar[BatchKind] = "flat"

    token_ids: Tensor  # long [B, T]
    behavior_logprobs: Tensor  # float32 [B, T], 0 on non-policy and padding slots
    action_mask: Tensor  # bool [B, T], True on policy tokens
    attention_mask: Tensor  # bool [B, T], True on real tokens
    versions: Tensor  # long [B, T], -1 on non-policy and padding slots
    rewards: Tensor  # float32 [B]
    failures: Tensor  # bool [B]
    leaf_ids: list[int]
    root_ids: list[int]  # GRPO groups: equal ids share a prompt
    branch_nodes: list[int] = field(default_factory=list)  # each row's branching node (see branching_nodes)
    branch_rows: list[list[int]] = field(default_factory=list)  # rows through that node ([] when alone)
    # each row's path as (node id, start, end) token spans, root first (see node_spans)
    node_spans: list[list[tuple[int, int, int]]] = field(default_factory=list)
    # float32 [B]: the sampled leaves each row stands for (identical siblings merged into one row,
    # trained as that many samples; see trainer/objective.py); None: one each
    weights: Tensor | None = None
    # long [B]: row i's reward pays its tokens before credit_ends[i], later ones earn 0
    # (reward="progress"); None: every row pays every token
    credit_ends: Tensor | None = None
    _consumed: bool = field(default=False, repr=False)

    @property
    def consumed(self) -> bool:
        """Whether a learner already trained on this batch object."""
        return self._consumed

    def mark_consumed(self) -> None:
        """Flag this batch as used; a second call raises RuntimeError (never train twice)."""
        if self._consumed:
            raise RuntimeError("batch already consumed: it must not be trained on twice")
        self._consumed = True

    @property
    def lengths(self) -> Tensor:
        """Real tokens per row."""
        return self.attention_mask.sum(dim=1)

    def gather_logprobs(self, logits: Tensor) -> Tensor:
        """Per-token log-probs ``[B, T]`` from flat logits ``[B, T, V]`` (0 at t=0 and padding)."""
        b, t = self.token_ids.shape
        if logits.shape[:2] != (b, t):
            raise ValueError(f"logits: expected shape [{b}, {t}, V], got {tuple(logits.shape)}")
        picked = token_logprobs(logits[:, :-1], self.token_ids[:, 1:].to(logits.device))
        out = torch.zeros(b, t, dtype=logits.dtype, device=logits.device)
        out[:, 1:] = picked * self.attention_mask[:, 1:].to(logits.device)
        return out


@dataclass
class PackedBatch:
    """One packed row of N tokens plus the maps back to the per-leaf ``flat`` view.

    ``kind`` is ``"packed"`` (see :data:`TrainBatch`).
    """

    kind: ClassVar[BatchKind] = "packed"

    flat: FlatBatch
    input_ids: Tensor  # long [1, N]
    position_ids: Tensor  # long [1, N]
    prev_index: Tensor  # long [B, T]: packed index predicting token t of leaf i
    token_index: Tensor  # long [B, T]: packed index of token t of leaf i (0 on padding)
    node_of: Tensor  # long [N]: which packed segment each token belongs to
    segment_ancestors: Tensor  # bool [S, S]: [s, a] = a is s or an ancestor of s
    root_spans: list[tuple[int, int]] = field(
        default_factory=list
    )  # packed [start, stop) of each root's subtree
    leaf_root: Tensor | None = None  # long [B]: index into root_spans of each leaf's root

    @property
    def consumed(self) -> bool:
        return self.flat.consumed

    def mark_consumed(self) -> None:
        self.flat.mark_consumed()

    @property
    def num_tokens(self) -> int:
        """N, the tokens one packed forward processes."""
        return int(self.input_ids.shape[1])

    @property
    def ideal_ratio(self) -> float:
        """Sum of path lengths over N: the compute saved if cost were linear in tokens."""
        return float(self.flat.lengths.sum()) / max(self.num_tokens, 1)

    def allowed(self) -> Tensor:
        """Bool ``[N, N]``: query i may attend key j (j on i's path, at or before i)."""
        anc = self.segment_ancestors[self.node_of][:, self.node_of]
        n = self.num_tokens
        return anc & torch.ones(n, n, dtype=torch.bool).tril()

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Float additive 4-D mask ``[1, 1, N, N]``: 0 where allowed, ``finfo(dtype).min`` elsewhere."""
        if not dtype.is_floating_point:
            raise ValueError(
                f"dtype: the packed mask must be a float dtype (bool is wrong under eager), got {dtype}"
            )
        mask = torch.full((self.num_tokens, self.num_tokens), torch.finfo(dtype).min, dtype=dtype)
        mask.masked_fill_(self.allowed(), 0.0)
        return mask[None, None]

    @property
    def max_root_tokens(self) -> int:
        """Packed tokens of the largest root (the widest row of a per-root forward)."""
        return max((b - a for a, b in self.root_spans), default=0)

    def chunk_width(self, roots: Sequence[int]) -> int:
        """W of a per-root forward over ``roots``: the packed tokens of the largest of them."""
        return max(self.root_spans[r][1] - self.root_spans[r][0] for r in roots)

    def root_chunks(self, budget: int) -> list[list[int]]:
        """Root indices grouped so that ``roots x widest root <= budget`` (<= 0: one group),
        largest roots first; each group is one per-root forward."""
        order = sorted(
            range(len(self.root_spans)), key=lambda r: -(self.root_spans[r][1] - self.root_spans[r][0])
        )
        if budget <= 0:
            return [order] if order else []
        chunks: list[list[int]] = []
        current: list[int] = []
        for r in order:
            width = self.root_spans[current[0]][1] - self.root_spans[current[0]][0] if current else 0
            width = max(width, self.root_spans[r][1] - self.root_spans[r][0])
            if current and (len(current) + 1) * width > budget:
                chunks.append(current)
                current = []
            current.append(r)
        chunks.append(current)
        return chunks

    def root_chunk(
        self, roots: Sequence[int], dtype: torch.dtype = torch.float32, dense_mask: bool = True
    ) -> dict[str, Tensor]:
        """The inputs of one per-root forward over ``roots``: ``input_ids``/``position_ids``
        ``[R, W]`` (right-padded), the float additive ``attention_mask`` ``[R, 1, W, W]`` (each
        root's ancestor-causal mask; a padding slot attends only to itself; only with
        ``dense_mask``, else see :meth:`tree_layout`), ``rows`` (the leaves of these roots,
        ``[b]``) and ``prev`` (``[b, T]``: the index into the flattened ``[R*W]`` logits
        predicting each token of those leaves)."""
        if not dtype.is_floating_point:
            raise ValueError(
                f"dtype: the packed mask must be a float dtype (bool is wrong under eager), got {dtype}"
            )
        spans = [self.root_spans[r] for r in roots]
        width = self.chunk_width(roots)
        n_roots = len(spans)
        ids = torch.zeros(n_roots, width, dtype=torch.long)
        pos = torch.zeros(n_roots, width, dtype=torch.long)
        to_chunk = torch.full((self.num_tokens,), -1, dtype=torch.long)
        for i, (a, b) in enumerate(spans):
            n = b - a
            ids[i, :n] = self.input_ids[0, a:b]
            pos[i, :n] = self.position_ids[0, a:b]
            to_chunk[a:b] = torch.arange(i * width, i * width + n)
        assert self.leaf_root is not None
        rows = torch.nonzero(
            torch.isin(self.leaf_root, torch.tensor(list(roots), dtype=torch.long))
        ).flatten()
        out = {"input_ids": ids, "position_ids": pos, "rows": rows, "prev": to_chunk[self.prev_index[rows]]}
        if dense_mask:
            allowed = self.ancestor_mask(roots)
            for i, (a, b) in enumerate(spans):
                pad = torch.arange(b - a, width)
                allowed[i, pad, pad] = True  # a padding slot attends only to itself
            mask = torch.full((n_roots, 1, width, width), torch.finfo(dtype).min, dtype=dtype)
            out["attention_mask"] = mask.masked_fill_(allowed[:, None], 0.0)
        return out

    def ancestor_mask(self, roots: Sequence[int]) -> Tensor:
        """Bool ``[R, W, W]`` over :meth:`root_chunk` ``(roots)``'s rows: token ``i`` of a root may
        attend to token ``j`` when ``j``'s node is ``i``'s node or an ancestor of it and ``j <= i``
        (nothing on padding)."""
        spans = [self.root_spans[r] for r in roots]
        width = self.chunk_width(roots)
        allowed = torch.zeros(len(spans), width, width, dtype=torch.bool)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        for i, (a, b) in enumerate(spans):
            n = b - a
            seg = self.node_of[a:b]
            allowed[i, :n, :n] = self.segment_ancestors[seg][:, seg] & causal[:n, :n]
        return allowed

    def attention_pairs(self, roots: Sequence[int]) -> int:
        """Query x key pairs that ``roots``' tokens may attend (each token: its ancestors' tokens and
        its own segment up to itself): the least any attention over their packed rows computes,
        without building a :meth:`tree_layout`."""
        spans = [self.root_spans[r] for r in roots]
        seg = torch.cat([self.node_of[a:b] for a, b in spans]) if spans else self.node_of[:0]
        counts = torch.bincount(seg, minlength=self.segment_ancestors.shape[0]).to(torch.float64)
        with_ancestors = self.segment_ancestors.to(torch.float64) @ counts  # own segment included
        return int((counts * (with_ancestors - counts) + counts * (counts + 1) / 2).sum())

    def tree_layout(self, roots: Sequence[int], block: int = BLOCK) -> TreeLayout:
        """The block-sparse attention layout of :meth:`root_chunk` ``(roots)`` (same row order and
        width): what :mod:`fr_agents.tree.attention` computes instead of the dense mask."""
        spans = [self.root_spans[r] for r in roots]
        width = self.chunk_width(roots)
        return TreeLayout.build([self.node_of[a:b] for a, b in spans], self.segment_ancestors, width, block)

    def gather_logprobs(self, logits: Tensor) -> Tensor:
        """Per-leaf log-probs ``[B, T]`` from packed logits ``[1, N, V]`` (0 at t=0 and padding)."""
        if logits.dim() != 3 or logits.shape[:2] != (1, self.num_tokens):
            raise ValueError(f"logits: expected shape [1, {self.num_tokens}, V], got {tuple(logits.shape)}")
        dev = logits.device
        picked = token_logprobs(logits[0], self.flat.token_ids.to(dev), self.prev_index.to(dev))  # [B, T]
        valid = self.flat.attention_mask.to(dev).clone()
        valid[:, 0] = False
        return picked * valid


TrainBatch: TypeAlias = FlatBatch | PackedBatch
"""What a learner step takes: either form; tell them apart by ``batch.kind`` (or ``isinstance``)."""


def flat_view(batch: TrainBatch) -> FlatBatch:
    """The per-leaf rows of either form: a flat batch itself, a packed batch's ``flat``."""
    return batch.flat if isinstance(batch, PackedBatch) else batch


def learner_rewards(trajs: Sequence[Trajectory], reward: str) -> list[float]:
    return [t.learner_reward(reward) for t in trajs]


def row_weights(weights: Sequence[float] | None, b: int) -> Tensor | None:
    """The batch's ``weights`` tensor: ``None`` when every row stands for one sampled leaf (the
    learner refuses weights that are not finite and > 0, before any work)."""
    if weights is None:
        return None
    if len(weights) != b:
        raise ValueError(f"weights: expected {b} row weights, got {len(weights)}")
    return None if all(w == 1 for w in weights) else torch.tensor(weights, dtype=torch.float32)


def build_flat(
    trajs: Sequence[Trajectory], reward: str = "env", weights: Sequence[float] | None = None
) -> FlatBatch:
    """Pad trajectories into a :class:`FlatBatch`; ``weights[i]`` is the number of sampled leaves
    row ``i`` stands for (identical siblings merged into it), default one each."""
    if not trajs:
        raise ValueError("leaf_ids: empty batch")
    rewards = learner_rewards(trajs, reward)
    lengths = torch.tensor([len(x.token_ids) for x in trajs])
    b, t = len(trajs), int(lengths.max())
    # one tensor per field for the whole batch, scattered into the padded rows (row-major order
    # of the mask is the concatenation order): a tensor per row and field cost more than the rest
    att = torch.arange(t) < lengths[:, None]

    def padded(name: str, dtype: torch.dtype, fill: float) -> Tensor:
        out = torch.full((b, t), fill, dtype=dtype)
        out[att] = torch.tensor(
            list(itertools.chain.from_iterable(getattr(x, name) for x in trajs)), dtype=dtype
        )
        return out

    tok = padded("token_ids", torch.long, 0)
    lp = padded("logprobs", torch.float32, 0.0)
    act = padded("policy_mask", torch.bool, False)
    ver = padded("versions", torch.long, -1)
    return FlatBatch(
        token_ids=tok,
        behavior_logprobs=lp,
        action_mask=act,
        attention_mask=att,
        versions=ver,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        failures=torch.tensor([x.failed for x in trajs], dtype=torch.bool),
        leaf_ids=[x.leaf_id for x in trajs],
        root_ids=[x.root_id for x in trajs],
        branch_nodes=(nodes := branching_nodes(trajs)),
        branch_rows=sharing_rows(trajs, nodes),
        node_spans=node_spans(trajs),
        weights=row_weights(weights, b),
        credit_ends=credit_ends(trajs, reward),
    )


def credit_ends(trajs: Sequence[Trajectory], reward: str) -> Tensor | None:
    """Each row's :meth:`~fr_agents.tree.nodes.Trajectory.credit_end` as a long ``[B]`` tensor, or
    None when every row's reward pays all its tokens."""
    ends = [t.credit_end(reward) for t in trajs]
    if all(e == len(t.token_ids) for e, t in zip(ends, trajs, strict=True)):
        return None
    return torch.tensor(ends, dtype=torch.long)


def node_spans(trajs: Sequence[Trajectory]) -> list[list[tuple[int, int, int]]]:
    """Each trajectory's path as ``(node, start, end)`` spans of its tokens, root first: which
    stored node every token of the row lies in. The store splits nodes where paths diverge, so
    two rows share a node exactly as far as they share a sample (the nodes baseline's values)."""
    out = []
    for x in trajs:
        ends = [*x.offsets[1:], len(x.token_ids)]
        out.append([(int(n), int(a), int(b)) for n, a, b in zip(x.path, x.offsets, ends, strict=True)])
    return out


def sharing_rows(trajs: Sequence[Trajectory], nodes: Sequence[int]) -> list[list[int]]:
    """For each row, the rows whose path passes through its branching node ``nodes[i]`` (its
    subtree in this batch, itself included); ``[]`` when no other leaf does (a linear episode)."""
    paths = [set(x.path) for x in trajs]
    out = []
    for node in nodes:
        rows = [j for j, p in enumerate(paths) if node in p]
        out.append(rows if len({trajs[j].leaf_id for j in rows}) > 1 else [])
    return out


def branching_nodes(trajs: Sequence[Trajectory]) -> list[int]:
    """Each trajectory's *branching node*: the deepest node of its path that another (different)
    leaf of the same list also passes through; the root when its path shares nothing but the
    prompt. The store splits nodes where paths diverge, so a fork is always a node boundary, and
    the leaves sharing a row's branching node are its siblings in the tree (tree baseline)."""
    through: dict[int, set[int]] = {}
    for x in trajs:
        for node in x.path:
            through.setdefault(node, set()).add(x.leaf_id)
    out = []
    for x in trajs:
        shared = [node for node in x.path if len(through[node]) > 1]
        out.append(shared[-1] if shared else (x.path[0] if x.path else x.root_id))
    return out


def build_packed(
    trajs: Sequence[Trajectory], reward: str = "env", weights: Sequence[float] | None = None
) -> PackedBatch:
    """Lay the union of the trajectories' path nodes out once, depth first (``weights`` as for
    :func:`build_flat`)."""
    flat = build_flat(trajs, reward, weights)
    # Segments of the union: node id -> (parent node id or None, offset, tokens).
    parent_of: dict[int, int | None] = {}
    span: dict[int, tuple[int, list[int]]] = {}
    order: list[int] = []  # first appearance, for a deterministic DFS
    for x in trajs:
        ends = [*x.offsets[1:], len(x.token_ids)]
        prev: int | None = None
        for node, start, stop in zip(x.path, x.offsets, ends, strict=True):
            if node not in span:
                parent_of[node] = prev
                span[node] = (start, x.token_ids[start:stop])
                order.append(node)
            prev = node
    kids: dict[int | None, list[int]] = {}
    for node in order:
        kids.setdefault(parent_of[node], []).append(node)
    seg_index: dict[int, int] = {}
    seg_start: list[int] = []
    ids: list[int] = []
    pos: list[int] = []
    node_of: list[int] = []
    stack = list(reversed(kids.get(None, [])))
    while stack:
        node = stack.pop()
        s = len(seg_start)
        seg_index[node] = s
        seg_start.append(len(ids))
        offset, toks = span[node]
        ids.extend(toks)
        pos.extend(range(offset, offset + len(toks)))
        node_of.extend([s] * len(toks))
        stack.extend(reversed(kids.get(node, [])))
    n_seg = len(seg_start)
    anc = np.zeros((n_seg, n_seg), dtype=bool)
    for node in order_by(seg_index):  # parents have smaller segment indices (DFS preorder)
        s = seg_index[node]
        p = parent_of[node]
        if p is not None:
            anc[s] = anc[seg_index[p]]
        anc[s, s] = True
    b, t = flat.token_ids.shape
    token_index = torch.zeros(b, t, dtype=torch.long)
    for i, x in enumerate(trajs):
        idx = [seg_start[seg_index[node]] + k for node in x.path for k in range(len(span[node][1]))]
        token_index[i, : len(idx)] = torch.tensor(idx, dtype=torch.long)
    prev_index = torch.zeros(b, t, dtype=torch.long)
    prev_index[:, 1:] = token_index[:, :-1]
    prev_index[:, 0] = token_index[:, 0]
    lengths = flat.lengths
    pad = torch.arange(t)[None, :] >= lengths[:, None]
    prev_index = torch.where(pad, token_index[:, :1].expand(b, t), prev_index)
    root_starts = [seg_start[seg_index[node]] for node in kids.get(None, [])]  # DFS order: ascending
    root_spans = list(zip(root_starts, [*root_starts[1:], len(ids)], strict=True))
    leaf_root = torch.tensor(
        [int(np.searchsorted(root_starts, int(token_index[i, 0]), side="right")) - 1 for i in range(b)],
        dtype=torch.long,
    )
    return PackedBatch(
        flat=flat,
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        prev_index=prev_index,
        token_index=token_index,
        node_of=torch.tensor(node_of, dtype=torch.long),
        segment_ancestors=torch.from_numpy(anc),
        root_spans=root_spans,
        leaf_root=leaf_root,
    )


def order_by(index: dict[int, int]) -> list[int]:
    """Keys of ``index`` sorted by their value."""
    return sorted(index, key=index.__getitem__)
