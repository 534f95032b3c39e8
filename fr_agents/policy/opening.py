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

:class:`Continuations` does the same for one episode's own history: a multi-turn episode asks for
its next turn with the whole conversation so far as the prompt, and a fork of the trajectory tree
asks with its parent's. When a row finishes, the engine keeps the keys and values it computed
(its prompt and all but its last sampled token); a later request whose prompt starts with those
tokens prefills only what follows (the env's answer, the next turn's template). The same rule
holds: they are kept only for a row that ran on the live weights from its prefill to its end,
and all are dropped at a swap. So an episode's turn ``t`` costs the tokens added since turn
``t - 1``, not its whole history.
"""

from __future__ import annotations

from collections import OrderedDict
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


class Continuations:
    """Keys and values of finished rows, by their tokens, for requests that continue them.

    A request continues a kept row whose tokens all start its prompt (an episode's next turn
    continues its last row; forks made together continue their parent's). Only whole rows: a
    request whose prompt is a *part* of a kept row (an episode retried after an infrastructure
    failure, with the same seed and prompt as the attempt that failed) prefills in full, as it did
    without that attempt, so a retry samples exactly what a run without the failure samples. An
    entry that a newer one extends is dropped when the newer one is kept (an episode holds one
    entry at a time), and ``max_tokens`` bounds the tokens held in all (least recently used out
    first). Per token this costs ``2 * layers * kv_heads * head_dim``
    numbers of the engine's dtype (46 KB for SmolLM2-135M in float32)."""

    def __init__(self, max_tokens: int = 32768) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, tuple[torch.Tensor, Past]] = OrderedDict()
        self._next = 0
        self._held = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_tokens(self) -> int:
        """Tokens whose keys and values are held now."""
        return self._held

    @staticmethod
    def _common(a: torch.Tensor, b: torch.Tensor) -> int:
        n = min(a.shape[0], b.shape[0])
        differ = (a[:n] != b[:n]).nonzero()
        return int(differ[0, 0]) if differ.shape[0] else n

    def find(self, prompt: Sequence[int]) -> tuple[int, Past | None]:
        """The longest kept row that ``prompt`` starts with, leaving ``prompt`` at least one token
        of its own: ``(its length, its keys and values)``, or ``(0, None)``."""
        if not self._entries:
            return 0, None
        ids = torch.tensor(prompt[:-1], dtype=torch.long)
        best, found = 0, None
        for key, (tokens, _) in self._entries.items():
            n = tokens.shape[0]
            if best < n <= ids.shape[0] and self._common(ids, tokens) == n:
                best, found = n, key
        if found is None or best < MIN_SHARED:
            return 0, None
        self._entries.move_to_end(found)
        return best, self._entries[found][1].head(best)

    def keep(self, tokens: Sequence[int], past: Past) -> None:
        """Keep ``past``, the keys and values of ``tokens`` under the live weights."""
        ids = torch.tensor(list(tokens), dtype=torch.long)
        n = ids.shape[0]
        if n < MIN_SHARED or n > self.max_tokens:
            return
        for key, (old, _) in list(self._entries.items()):
            common = self._common(ids, old)
            if common == old.shape[0]:  # the new row extends it
                self._held -= old.shape[0]
                del self._entries[key]
            elif common == n:  # it already holds all of the new row
                return
        self._entries[self._next] = (ids, past)
        self._next += 1
        self._held += n
        while self._held > self.max_tokens:
            _, (old, _) = self._entries.popitem(last=False)
            self._held -= old.shape[0]

    def forget(self) -> None:
        """The weights changed: every kept entry is stale."""
        self._entries.clear()
        self._held = 0
