"""A tiny, deterministic Qwen2-style causal LM built entirely in code.

Tests, benchmarks and CPU demos need a real transformers model without downloading weights.
:func:`create_tiny` writes a normal Hugging Face directory (``config.json``, safetensors weights,
tokenizer files with a ChatML chat template) that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load like any hub model.

* The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on
  ``fr_agents/models/corpus.txt`` (shipped in the repo), so any string round-trips exactly.
* The model is Qwen2-style with **untied** input/output embeddings (the trainer updates both).
* The build is deterministic: the same ``size`` and ``seed`` give byte-identical weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus.txt")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as used by Qwen2/SmolLM2: every message is "<|im_start|>role\ncontent<|im_end|>\n".
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySize:
    """Architecture hyper-parameters of one tiny size."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048


SIZES: dict[str, TinySize] = {
    # ~60k parameters: unit tests that only need "a real model".
    "nano": TinySize(512, 32, 2, 2, 1, 64),
    # ~1M parameters: the size the RL demos learn 2-digit addition with on 2 CPU cores.
    "micro": TinySize(1024, 128, 4, 4, 2, 384),
    # ~5M parameters: a little more capacity for multi-turn demos.
    "small": TinySize(2048, 256, 6, 8, 4, 768),
}


def train_tokenizer(vocab_size: int):
    """Train a byte-level BPE on the shipped corpus and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def create_tiny(path: str | Path, size: str = "micro", seed: int = 0) -> Path:
    """Write a tiny Qwen2-style model + tokenizer to ``path`` and return the directory.

    ``size`` is one of ``nano``, ``micro``, ``small``; ``seed`` fixes the random initialisation.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    spec = SIZES[size]
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(spec.vocab_size)
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    # Fork the global RNG so building a model never perturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "fr_agents_tiny.json").write_text(json.dumps({"size": size, "seed": seed}) + "\n")
    return out
