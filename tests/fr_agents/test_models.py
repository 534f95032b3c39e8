"""The in-code tiny model and model-name resolution."""

from __future__ import annotations

import hashlib

import pytest
import torch

from fr_agents.models import ModelNotFoundError, create_tiny, load_policy, resolve_model

torch.set_num_threads(1)


def _digest(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_tiny_is_deterministic_and_loads(tmp_path):
    a = create_tiny(tmp_path / "a", size="nano", seed=3)
    b = create_tiny(tmp_path / "b", size="nano", seed=3)
    c = create_tiny(tmp_path / "c", size="nano", seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]
    model, tok = load_policy(str(a))
    assert not model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "2+3= ünïcode €"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\n2+3= ünïcode €<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text  # byte-level: exact round trip
    assert tok.convert_ids_to_tokens(ids[0]) == "<|im_start|>"


def test_resolve_forms(tmp_path, monkeypatch):
    monkeypatch.setenv("FR_AGENTS_CACHE", str(tmp_path / "cache"))
    d = resolve_model("tiny-nano")
    assert d == tmp_path / "cache" / "tiny-nano-seed0" and (d / "config.json").exists()
    assert resolve_model(str(d)) == d
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ModelNotFoundError, match="accepted forms"):
        resolve_model("tiny-huge")
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        resolve_model("definitely not a model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="size"):
        create_tiny(tmp_path / "x", size="huge")


@pytest.mark.slow
def test_smollm2_first_turn_is_coherent():
    """SmolLM2-135M converted from the wheel's GGUF answers a simple question sensibly."""
    model, tok = load_policy("smollm2-135m")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1] :])
