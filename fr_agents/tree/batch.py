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

Rewards: ``reward="env"`` uses the env reward, ``"partial"`` the partial score of unfinished
(truncated/aborted) leaves that have one. ``failures[i]`` is True when leaf ``i`` did not finish
normally (status truncated/aborted) or its env reward is <= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fr_agents.tree.trajectory import Trajectory


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


@dataclass
class FlatBatch:
    """Padded per-trajectory tensors (pad token 0, right padding)."""

    token_ids: Tensor  # long [B, T]
    behavior_logprobs: Tensor  # float32 [B, T], 0 on non-policy and padding slots
    action_mask: Tensor  # bool [B, T], True on policy tokens
    attention_mask: Tensor  # bool [B, T], True on real tokens
    versions: Tensor  # long [B, T], -1 on non-policy and padding slots
    rewards: Tensor  # float32 [B]
    failures: Tensor  # bool [B]
    leaf_ids: list[int]
    root_ids: list[int]  # GRPO groups: equal ids share a prompt
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
    """One packed row of N tokens plus the maps back to the per-leaf ``flat`` view."""

    flat: FlatBatch
    input_ids: Tensor  # long [1, N]
    position_ids: Tensor  # long [1, N]
    prev_index: Tensor  # long [B, T]: packed index predicting token t of leaf i
    token_index: Tensor  # long [B, T]: packed index of token t of leaf i (0 on padding)
    node_of: Tensor  # long [N]: which packed segment each token belongs to
    segment_ancestors: Tensor  # bool [S, S]: [s, a] = a is s or an ancestor of s

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

    def gather_logprobs(self, logits: Tensor) -> Tensor:
        """Per-leaf log-probs ``[B, T]`` from packed logits ``[1, N, V]`` (0 at t=0 and padding)."""
        if logits.dim() != 3 or logits.shape[:2] != (1, self.num_tokens):
            raise ValueError(f"logits: expected shape [1, {self.num_tokens}, V], got {tuple(logits.shape)}")
        dev = logits.device
        picked = token_logprobs(logits[0], self.flat.token_ids.to(dev), self.prev_index.to(dev))  # [B, T]
        valid = self.flat.attention_mask.to(dev).clone()
        valid[:, 0] = False
        return picked * valid


def learner_rewards(trajs: Sequence[Trajectory], reward: str) -> list[float]:
    return [t.learner_reward(reward) for t in trajs]


def build_flat(trajs: Sequence[Trajectory], reward: str = "env") -> FlatBatch:
    """Pad trajectories into a :class:`FlatBatch`."""
    if not trajs:
        raise ValueError("leaf_ids: empty batch")
    rewards = learner_rewards(trajs, reward)
    b, t = len(trajs), max(len(x.token_ids) for x in trajs)
    tok = torch.zeros(b, t, dtype=torch.long)
    lp = torch.zeros(b, t, dtype=torch.float32)
    act = torch.zeros(b, t, dtype=torch.bool)
    att = torch.zeros(b, t, dtype=torch.bool)
    ver = torch.full((b, t), -1, dtype=torch.long)
    for i, x in enumerate(trajs):
        n = len(x.token_ids)
        tok[i, :n] = torch.tensor(x.token_ids, dtype=torch.long)
        lp[i, :n] = torch.tensor(x.logprobs, dtype=torch.float32)
        act[i, :n] = torch.tensor(x.policy_mask, dtype=torch.bool)
        att[i, :n] = True
        ver[i, :n] = torch.tensor(x.versions, dtype=torch.long)
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
    )


def build_packed(trajs: Sequence[Trajectory], reward: str = "env") -> PackedBatch:
    """Lay the union of the trajectories' path nodes out once, depth first."""
    flat = build_flat(trajs, reward)
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
    return PackedBatch(
        flat=flat,
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        prev_index=prev_index,
        token_index=token_index,
        node_of=torch.tensor(node_of, dtype=torch.long),
        segment_ancestors=torch.from_numpy(anc),
    )


def order_by(index: dict[int, int]) -> list[int]:
    """Keys of ``index`` sorted by their value."""
    return sorted(index, key=index.__getitem__)
