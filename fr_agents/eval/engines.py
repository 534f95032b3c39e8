"""Open an inference engine for one checkpoint: ``hf``, ``vllm`` or ``openai``.

* ``hf``: the checkpoint (any form :func:`fr_agents.models.resolve_model` accepts: ``tiny``, a
  local HF directory such as a training checkpoint, a hub id) loaded with transformers, behind
  :class:`~fr_agents.policy.hf.HFEngine`.
* ``vllm``: the same checkpoint in a local vLLM engine (needs vllm; see ``fr-agents doctor``).
* ``openai``: an OpenAI-compatible completions server at ``base_url`` serving the model named
  ``checkpoint``. The tokenizer (for the chat template: the rollout is token-in/token-out) comes
  from ``tokenizer`` or, when that is empty, from ``checkpoint`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fr_agents.policy.base import Engine

ENGINES = ("hf", "vllm", "openai")


@dataclass
class OpenedEngine:
    """An engine, the tokenizer that encodes its prompts, and how to release it."""

    engine: Engine
    tokenizer: Any
    close: Callable[[], None]


def _tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    from fr_agents.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _vllm_engine_class() -> Any:
    try:
        from fr_agents.policy.vllm_engine import VLLMEngine
    except ImportError as e:
        raise ValueError(
            f"--engine vllm: the vLLM engine cannot be imported here ({e}); install vllm "
            "(`fr-agents doctor` says how) or use --engine hf"
        ) from e
    return VLLMEngine


def open_engine(
    kind: str,
    checkpoint: str,
    *,
    dtype: str = "float32",
    device: str | None = None,
    max_batch_size: int = 64,
    seed: int = 0,
    base_url: str | None = None,
    api_key: str | None = None,
    tokenizer: str | None = None,
) -> OpenedEngine:
    """The engine of ``kind`` for ``checkpoint`` (see the module docstring)."""
    if kind not in ENGINES:
        raise ValueError(f"--engine: expected one of {', '.join(ENGINES)}, got {kind!r}")
    if kind == "hf":
        from fr_agents.models import load_policy
        from fr_agents.policy.hf import HFEngine

        model, tok = load_policy(checkpoint, dtype, device)
        hf = HFEngine(model, tok, max_batch_size=max_batch_size, seed=seed)
        return OpenedEngine(hf, tok, hf.close_sync)
    if kind == "openai":
        if not base_url:
            raise ValueError("--base-url: required with --engine openai (e.g. http://127.0.0.1:8000/v1)")
        from fr_agents.policy.openai_engine import OpenAIEngine

        tok = _tokenizer(tokenizer or checkpoint)
        return OpenedEngine(OpenAIEngine(base_url, checkpoint, api_key=api_key), tok, lambda: None)
    from fr_agents.models import resolve_model

    cls = _vllm_engine_class()
    engine = cls(str(resolve_model(checkpoint)), seed=seed, dtype=dtype)
    tok = _tokenizer(tokenizer or checkpoint)
    close = getattr(engine, "close_sync", None) or (lambda: None)
    return OpenedEngine(engine, tok, close)
