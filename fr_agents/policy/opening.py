"""The opening a rollout's prompts share, kept across the HF engine's joins and waves.

A training rollout's prompts start alike: the chat template's opening, a system prompt, example
exchanges, then the task. In the engine's running batch, rows finish one at a time and the
requests that take their places join one or two at a time, so what the joiners of one join share
(``HFEngine._shared_len``) is often nothing, and each joiner used to prefill its whole prompt: on
math-smollm2 ~90 prompt tokens for a ~23-token reply. :class:`Opening` keeps the longest opening a
group of requests was seen to share, with its keys and values, and a joiner that starts with it
prefills only what follows (:func:`~fr_agents.models.compact.compact_prefill`'s ``past``).

Why this is exact: a token's keys and values depend only on the tokens before it and on the
weights. So those of the kept opening's first ``n`` tokens serve any prompt that starts with
those ``n`` tokens, as long as the weights that computed them are the live ones: the engine drops
them at every weight swap (:meth:`Opening.forget`), and the next join that needs them computes
them again under the new weights. A prompt's prefill therefore always runs on one weight version,
as before, and the logits equal those of prefilling the whole prompt up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fr_agents.models.compact import Past, opening_kv

MIN_SHARED = 2  # a shorter shared start is not worth a separate pass


def shared_start(reference: Sequence[int], prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens of ``reference`` every prompt starts with, leaving each prompt at
    least one token of its own (its prefill yields its first logits); 0 below :data:`MIN_SHARED`."""
    n = min(len(reference), min(len(p) for p in prompts) - 1)
    for p in prompts:
        k = 0
        while k < n and p[k] == reference[k]:
            k += 1
        n = k
        if n < MIN_SHARED:
            return 0
    return n


class Opening:
    """The longest opening seen shared by a group of prompts, and its keys and values under the
    live weights (computed when first needed, dropped at each swap)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._past: Past | None = None

    def match(self, prompts: Sequence[Sequence[int]]) -> int:
        """How many of the kept opening's tokens every prompt starts with (:func:`shared_start`)."""
        return shared_start(self.tokens, prompts)

    def past(self, model: torch.nn.Module, n: int, fused: list | None) -> Past:
        """Keys and values of the opening's first ``n`` tokens under the live weights."""
        if self._past is None or self._past.length < n:
            ids = torch.tensor(self.tokens[:n], dtype=torch.long, device=next(model.parameters()).device)
            self._past = opening_kv(model, ids, fused)
        return self._past.head(n)

    def remember(self, tokens: Sequence[int], past: Past) -> None:
        """A group of prompts shared ``tokens``, whose keys and values under the live weights are
        ``past``: kept when longer than the opening kept so far (or when it starts that opening and
        covers more of it than the keys and values kept for it)."""
        tokens = list(tokens)
        if len(tokens) > len(self.tokens):
            self.tokens, self._past = tokens, past
        elif tokens == self.tokens[: len(tokens)] and (self._past is None or self._past.length < len(tokens)):
            self._past = past

    def forget(self) -> None:
        """The weights changed: the kept keys and values are stale (the tokens stay)."""
        self._past = None
