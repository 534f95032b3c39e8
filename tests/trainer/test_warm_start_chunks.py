"""A warm-start batch of long demos (whole ALFWorld episodes) runs a few demos at a time with the
vocabulary projection at the loss positions only: the same loss and gradients as the whole batch."""

from __future__ import annotations

import pytest
import torch

import trainer.warm_start as ws
from fr_agents.models.resolve import load_policy


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_long_batch_in_groups_has_the_whole_batchs_loss_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, _ = load_policy("tiny")
    vocab = model.get_output_embeddings().weight.shape[0]
    demos = []
    for i in range(5):  # 5 x up to 1,400 tokens: over SFT_CHUNK_TOKENS, so split
        ids = torch.randint(3, vocab, (900 + 120 * i,)).tolist()
        demos.append(ws.SpanDemo(ids, [(100, 140), (500 + i, 530), (len(ids) - 20, len(ids))]))
    demos.append(([5, 6, 7], [8, 9]))  # a (prompt, target) pair among them
    assert sum(1 for _ in demos) * max(len(ws._as_span_demo(d).ids) for d in demos) > ws.SFT_CHUNK_TOKENS

    model.zero_grad()
    got = ws._demo_loss_backward(model, demos, 0, torch.device("cpu"), "")
    split = grads(model)
    monkeypatch.setattr(ws, "SFT_CHUNK_TOKENS", 10**9)  # the same batch in one piece
    model.zero_grad()
    want = ws._demo_loss_backward(model, demos, 0, torch.device("cpu"), "")
    whole = grads(model)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert split.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_compact_forward_gives_the_warm_starts_loss_and_gradients() -> None:
    """model.compact_forward in the warm start: demos through the compact forward (each through its
    last loss position, their shared opening once, the head at the loss positions) have the loss and
    gradients of transformers' forward; a model it does not take (float64) runs transformers'."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, _ = load_policy("tiny")  # a Qwen2 model with grouped-query attention (4 heads, 2 key/value)
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    vocab = model.get_output_embeddings().weight.shape[0]
    opening = torch.randint(3, vocab, (12,)).tolist()  # every demo opens the same way
    demos: list = []
    for i in range(4):
        ids = opening + torch.randint(3, vocab, (60 + 25 * i,)).tolist()
        demos.append(ws.SpanDemo(ids, [(20, 30), (40 + i, 55), (len(ids) - 9, len(ids))]))
    demos.append((opening + [5, 6, 7], [8, 9]))

    model.zero_grad()
    plain = ws._demo_loss_backward(model, demos, 0, torch.device("cpu"), "", compact=False)
    want = grads(model)
    model.zero_grad()
    fast = ws._demo_loss_backward(model, demos, 0, torch.device("cpu"), "", compact=True)
    got = grads(model)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)

    wide = model.to(torch.float64)
    wide.zero_grad()
    refused = ws._demo_loss_backward(wide, demos, 0, torch.device("cpu"), "", compact=True)
    torch.testing.assert_close(refused.float(), plain, rtol=1e-4, atol=1e-5)
