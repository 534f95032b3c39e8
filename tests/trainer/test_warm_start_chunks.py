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
