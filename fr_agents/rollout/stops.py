"""Stop ids: which sampled token ends an assistant's turn.

An episode's turn ends when the engine samples one of these ids; the token is kept (it is what the
policy sampled) but left out of the action text the env sees. ``RolloutOptions.stop_token_ids``
names them; left at ``None`` they come from the tokenizer: its eos plus whichever of the usual
chat turn ends (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Phi's ``<|end|>``, Gemma's
``<end_of_turn>``) its vocabulary holds.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any


def default_stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids of a chat tokenizer: its eos plus the usual ChatML/Llama turn ends.

    Computed once per tokenizer object (reading the vocabulary costs about a millisecond, which
    every episode would otherwise pay)."""
    try:
        return _STOP_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    stops = _find_stop_ids(tokenizer)
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _STOP_IDS[tokenizer] = stops
    return stops


_STOP_IDS: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


def _find_stop_ids(tokenizer: Any) -> tuple[int, ...]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return tuple(sorted(ids))
