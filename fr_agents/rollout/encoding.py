"""Prompt encoding and token truth: text to ids and back, checked both ways.

The rollout never re-tokenises what the engine sampled; it asks the chat template only for the
text that follows what is already held, and encodes that text here. Every encode is checked: the
ids must decode back to exactly the text (:func:`encode_exact`), else :class:`TokenDriftError`.

:func:`encode_prompt` is the one prompt encoder (rollout, training, evaluation and warm-start
demos all use it): the chat template of :func:`prompt_messages` (system prompt, example turns,
the first observation) with the generation prompt.

Stop ids. An episode's turn ends when the engine samples one of :func:`default_stop_ids`; the token
is kept (it is what the policy sampled) but left out of the action text the env sees.
``RolloutOptions.stop_token_ids`` names them; left at ``None`` they come from the tokenizer: its eos
plus whichever of the usual chat turn ends (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Phi's
``<|end|>``, Gemma's ``<end_of_turn>``) its vocabulary holds.

The fast path. A transformers fast tokenizer does its work in a Rust backend; the Python wrapper
around it costs most of the time an episode's prompt takes to encode. :func:`direct_backend`
hands out that backend where calling it gives exactly what the wrapper would, and
:func:`encode_exact` / :func:`decode` use it there.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any


class TokenDriftError(RuntimeError):
    """The chat template re-renders an earlier turn differently from the tokens already held."""

    def __init__(self, turn: int, detail: str) -> None:
        super().__init__(f"token drift at turn {turn}: {detail}")
        self.turn = turn


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template of ``messages`` as text, with the generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


_DIRECT_CLASSES: dict[type, bool] = {}


def direct_backend(tokenizer: Any) -> Any | None:
    """The Rust ``tokenizers.Tokenizer`` behind ``tokenizer`` when calling it directly gives exactly
    what ``tokenizer.encode(text, add_special_tokens=False)`` and ``tokenizer.decode(ids,
    skip_special_tokens=False, clean_up_tokenization_spaces=False)`` give; ``None`` otherwise.

    A transformers fast tokenizer does its work in that backend; the Python around it (argument
    checks, padding and truncation set-up, a ``BatchEncoding`` per call) costs most of the time an
    episode's prompt takes to encode and check on math-tiny's rollout. The direct call is taken only
    where the wrapper adds nothing: the tokenizer's class keeps transformers' own ``encode`` /
    ``decode`` (a class that overrides them is always asked itself), and the backend holds no
    truncation or padding and splits special tokens as the wrapper would ask it to (the wrapper
    resets those per call; a backend left configured otherwise goes through the wrapper)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        return None
    cls = type(tokenizer)
    plain = _DIRECT_CLASSES.get(cls)
    if plain is None:
        try:
            from transformers.tokenization_utils_base import PreTrainedTokenizerBase
            from transformers.tokenization_utils_tokenizers import TokenizersBackend
        except ImportError:  # another transformers layout: always ask the tokenizer
            plain = False
        else:
            plain = (
                isinstance(tokenizer, TokenizersBackend)
                and all(
                    getattr(cls, name) is getattr(PreTrainedTokenizerBase, name)
                    for name in ("encode", "decode", "_get_padding_truncation_strategies")
                )
                and all(
                    getattr(cls, name) is getattr(TokenizersBackend, name)
                    for name in ("_encode_plus", "_decode", "set_truncation_and_padding")
                )
            )
        _DIRECT_CLASSES[cls] = plain
    if not plain or backend.truncation is not None or backend.padding is not None:
        return None
    if backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return backend


def encode_exact(tokenizer: Any, text: str, turn: int) -> list[int]:
    """The ids of ``text`` (no special tokens added); :class:`TokenDriftError` naming ``turn`` when
    they do not decode back to exactly ``text``."""
    direct = direct_backend(tokenizer)
    if direct is not None:
        ids = direct.encode(text, add_special_tokens=False).ids
        back = direct.decode(ids, skip_special_tokens=False)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != text:
        raise TokenDriftError(
            turn,
            f"the tokenizer does not round-trip the appended text {text[:80]!r} (decodes to {back[:80]!r})",
        )
    return list(ids)


def prompt_messages(
    observation: str, system_prompt: str | None = None, examples: Sequence[tuple[str, str]] = ()
) -> list[dict[str, str]]:
    """The chat messages of an episode's first turn: the system prompt (if any), the example
    turns (``(role, content)`` pairs: a worked example shown in the chat template), then the
    observation as the user's message."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": role, "content": content} for role, content in examples]
    return [*messages, {"role": "user", "content": observation}]


def example_turns(examples: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """``env.examples`` (``{role, content}`` mappings) as the ``(role, content)`` pairs
    :class:`~fr_agents.rollout.RolloutOptions` holds."""
    return tuple((str(t["role"]), str(t["content"])) for t in examples)


def encode_prompt(
    tokenizer: Any,
    observation: str,
    system_prompt: str | None = None,
    examples: Sequence[tuple[str, str]] = (),
) -> tuple[str, list[int]]:
    """The prompt of an episode, as text and token ids: the chat template of
    :func:`prompt_messages` with the generation prompt, encoded with the round-trip check (a
    tokenizer that does not decode the ids back to the text raises :class:`TokenDriftError`).
    The one prompt encoder: rollout, training, evaluation and warm-start demos all use it."""
    text = render(tokenizer, prompt_messages(observation, system_prompt, examples))
    return text, encode_exact(tokenizer, text, 0)


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of ``ids``, special tokens kept, spaces not cleaned up (what was sampled, verbatim)."""
    direct = direct_backend(tokenizer)
    if direct is not None:
        return direct.decode(list(ids), skip_special_tokens=False)
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def default_stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids of a chat tokenizer: its eos plus the usual ChatML/Llama turn ends ("Stop ids"
    in the module docstring).

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
