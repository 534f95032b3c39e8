"""Token ids -> text for people: whole runs decoded together, single tokens for the heat map.

A byte-level BPE token may hold part of a UTF-8 character, so text is decoded run by run (a run
is a stretch of tokens of one *kind*: ``policy`` tokens the model sampled, ``demo`` tokens of a
scripted reply, ``env`` tokens of the prompt and the observations). Per-token pieces (for the
log-prob heat map) decode one id at a time and may show U+FFFD for such a partial character.
Special tokens (the chat template's markers) are kept: they are part of what the model saw.
Ids outside the tokenizer's vocabulary (a store written with another model) show as ``⟨id⟩``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KINDS = ("env", "policy", "demo")
_ROLE_LINES = {
    "system",
    "user",
    "assistant",
}  # what a chat template's role header leaves once its markers are gone


class TokenText:
    """Decode with one tokenizer (a ``tokenizers.Tokenizer`` or a transformers tokenizer);
    thread-safe, per-token pieces cached."""

    def __init__(self, tokenizer: Any, source: str = "") -> None:
        self.tok = tokenizer
        self.source = source
        if hasattr(tokenizer, "get_vocab_size"):
            self.vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
        else:
            self.vocab = len(tokenizer)
        self._lock = threading.Lock()
        self._pieces: dict[int, str] = {}

    @classmethod
    def load(cls, where: str | Path) -> TokenText:
        """The tokenizer saved in directory ``where`` (a checkpoint or a model directory).

        A fast tokenizer's ``tokenizer.json`` loads with the small ``tokenizers`` library (a
        second; importing transformers can take ten); other formats fall back to transformers.
        """
        path = Path(where)
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return cls(Tokenizer.from_file(str(path / "tokenizer.json")), str(where))
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(where), str(where))

    def text(self, ids: Sequence[int]) -> str:
        """The text of a run of ids (unknown ids as ``⟨id⟩``)."""
        out: list[str] = []
        known: list[int] = []
        for i in ids:
            i = int(i)
            if 0 <= i < self.vocab:
                known.append(i)
                continue
            if known:
                out.append(self._decode(known))
                known = []
            out.append(f"⟨{i}⟩")
        if known:
            out.append(self._decode(known))
        return "".join(out)

    def piece(self, i: int) -> str:
        """The text of one token."""
        i = int(i)
        got = self._pieces.get(i)
        if got is None:
            got = self.text([i])
            self._pieces[i] = got
        return got

    def runs(self, ids: Sequence[int], kinds: Sequence[str]) -> list[dict[str, Any]]:
        """``[{kind, text, n}]``: maximal runs of one kind, each decoded as a whole."""
        out: list[dict[str, Any]] = []
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or kinds[k] != kinds[start]:
                out.append({"kind": kinds[start], "text": self.text(ids[start:k]), "n": k - start})
                start = k
        return out

    def turns(self, ids: Sequence[int], kinds: Sequence[str]) -> list[dict[str, str]]:
        """A trajectory as turns to read: ``[{kind, text}]``, one per run of a kind (the env's
        prompt and observations, the policy's or a demo's replies), decoded without the chat
        template's special tokens and without the role names they leave on a line of their own
        (``system``, ``user``, ``assistant``); empty turns are left out."""
        out: list[dict[str, str]] = []
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or kinds[k] != kinds[start]:
                known = [int(i) for i in ids[start:k] if 0 <= int(i) < self.vocab]
                lines = self._decode(known, special=False).split("\n")
                text = "\n".join(ln for ln in lines if ln.strip() not in _ROLE_LINES).strip()
                if text:
                    out.append({"kind": kinds[start], "text": text})
                start = k
        return out

    def _decode(self, ids: list[int], special: bool = True) -> str:
        with self._lock:
            if hasattr(self.tok, "get_vocab_size"):  # tokenizers.Tokenizer
                return str(self.tok.decode(ids, skip_special_tokens=not special))
            return str(
                self.tok.decode(ids, skip_special_tokens=not special, clean_up_tokenization_spaces=False)
            )
