"""Token segments: the unit a tree node stores, with validation and the sharing rule.

A segment is a run of tokens appended in one call. Every token carries four facts: its id, the
behaviour log-prob (policy tokens only; 0.0 elsewhere), the policy mask and the policy version
(``-1`` for prompt/environment tokens). A node stores one version scalar; the per-token version
is ``version`` where the mask is True and ``-1`` elsewhere, so four columns cost 9 bytes a token
(int32 id + float32 log-prob + one mask byte).

Two tokens are *the same sample* when id, mask, log-prob bits and effective version all agree.
The tree shares a prefix only as far as that holds (:func:`common_prefix`): identical tokens
with different log-probs or versions are different samples and are never merged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class Segment:
    """Validated token run: ``tokens`` int32, ``logprobs`` float32, ``mask`` bool, one ``version``."""

    tokens: np.ndarray
    logprobs: np.ndarray
    mask: np.ndarray
    version: int

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def versions(self) -> np.ndarray:
        """Per-token policy version: ``version`` on policy tokens, ``-1`` elsewhere."""
        return np.where(self.mask, np.int64(self.version), np.int64(-1))

    def slice(self, start: int, stop: int | None = None) -> Segment:
        """The sub-run ``[start:stop]``; its version collapses to -1 when it holds no policy token."""
        mask = self.mask[start:stop]
        return Segment(
            self.tokens[start:stop],
            self.logprobs[start:stop],
            mask,
            self.version if bool(mask.any()) else -1,
        )

    # ------------------------------------------------------------------ (de)serialisation
    def to_blobs(self) -> tuple[bytes, bytes, bytes]:
        """Little-endian bytes for the three token columns (what SQLite stores)."""
        return (
            self.tokens.astype("<i4", copy=False).tobytes(),
            self.logprobs.astype("<f4", copy=False).tobytes(),
            self.mask.astype(np.uint8).tobytes(),
        )

    @staticmethod
    def from_blobs(tokens: bytes, logprobs: bytes, mask: bytes, version: int) -> Segment:
        """Inverse of :meth:`to_blobs`."""
        return Segment(
            np.frombuffer(tokens, dtype="<i4"),
            np.frombuffer(logprobs, dtype="<f4"),
            np.frombuffer(mask, dtype=np.uint8).astype(bool),
            int(version),
        )


def make_segment(
    token_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    policy_mask: Sequence[bool] | bool,
    version: int,
) -> Segment:
    """Validate one append's arguments and normalise them into a :class:`Segment`.

    ``policy_mask`` may be one bool for the whole run. ``logprobs`` may be None only when no
    token is a policy token. Log-probs of non-policy tokens are ignored (stored as 0.0).
    Raises ``ValueError`` naming the offending field; nothing has been written at that point.
    """
    tokens = _token_array(token_ids, "token_ids")
    n = tokens.shape[0]
    if n == 0:
        raise ValueError("token_ids: must hold at least one token")
    if isinstance(policy_mask, (bool, np.bool_)):
        mask = np.full(n, bool(policy_mask))
    else:
        mask = np.asarray([bool(m) for m in policy_mask], dtype=bool)
        if mask.shape[0] != n:
            raise ValueError(f"policy_mask: length {mask.shape[0]} != len(token_ids) {n}")
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise ValueError(f"version: must be an int, got {version!r}")
    version = int(version)
    if mask.any() and version < 0:
        raise ValueError(f"version: policy tokens need a version >= 0, got {version}")
    if logprobs is None:
        if mask.any():
            raise ValueError("logprobs: required when policy_mask marks policy tokens")
        lp = np.zeros(n, dtype=np.float32)
    else:
        lp = np.asarray(list(logprobs), dtype=np.float64)
        if lp.shape != (n,):
            raise ValueError(f"logprobs: length {lp.shape[0] if lp.ndim else 0} != len(token_ids) {n}")
        pol = lp[mask]
        if not np.all(np.isfinite(pol)):
            raise ValueError("logprobs: policy tokens need finite log-probs")
        if np.any(pol > 0):
            bad = int(np.flatnonzero(mask)[np.argmax(pol > 0)])
            raise ValueError(f"logprobs: positive log-prob {lp[bad]} on policy token at index {bad}")
        # Non-policy log-probs are not samples: store 0.0; "+ 0.0" turns -0.0 into 0.0 so the
        # bitwise sample identity below never depends on the sign of zero.
        lp = np.where(mask, lp, 0.0).astype(np.float32) + np.float32(0.0)
    return Segment(tokens, lp, mask, version if mask.any() else -1)


def _token_array(token_ids: Sequence[int], field: str) -> np.ndarray:
    try:
        arr = np.asarray(list(token_ids))
    except TypeError as e:
        raise ValueError(f"{field}: expected a sequence of ints ({e})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{field}: expected a flat sequence of ints")
    if arr.min() < 0 or arr.max() > _MAX_TOKEN_ID:
        raise ValueError(f"{field}: token ids must lie in [0, 2**31)")
    return arr.astype(np.int32)


def prompt_tokens(token_ids: Sequence[int]) -> np.ndarray:
    """Validate root prompt ids (non-empty ints) and return them as int32."""
    tokens = _token_array(token_ids, "prompt_token_ids")
    if tokens.shape[0] == 0:
        raise ValueError("prompt_token_ids: must hold at least one token")
    return tokens


def common_prefix(a: Segment, b: Segment) -> int:
    """Number of leading tokens that are the same sample in ``a`` and ``b`` (see module doc)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    same = (
        (a.tokens[:n] == b.tokens[:n])
        & (a.mask[:n] == b.mask[:n])
        & (a.logprobs[:n].view(np.int32) == b.logprobs[:n].view(np.int32))
        & (a.versions[:n] == b.versions[:n])
    )
    if same.all():
        return n
    return int(np.argmin(same))


def check_reward(value: float, field: str, *, unit: bool = False) -> float:
    """A finite float (in [0, 1] when ``unit``); ValueError naming ``field`` otherwise."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{field}: must be finite, got {x}")
    if unit and not 0.0 <= x <= 1.0:
        raise ValueError(f"{field}: must lie in [0, 1], got {x}")
    return x
