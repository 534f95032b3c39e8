"""Default models: the in-code tiny model, SmolLM2-135M from a local GGUF, and name resolution."""

from fr_agents.models.resolve import (
    ACCEPTED_FORMS,
    ModelNotFoundError,
    cache_dir,
    load_policy,
    load_tokenizer,
    model_kind,
    resolve_model,
    smollm2_dir,
    tiny_dir,
)
from fr_agents.models.tiny import SIZES, create_tiny

__all__ = [
    "ACCEPTED_FORMS",
    "SIZES",
    "ModelNotFoundError",
    "cache_dir",
    "create_tiny",
    "load_policy",
    "load_tokenizer",
    "model_kind",
    "resolve_model",
    "smollm2_dir",
    "tiny_dir",
]
