"""The HF engine keeps the prompts' shared opening across joins (fr_agents/policy/opening.py):
a prefill that starts from kept keys and values equals one that computes them, and a joiner
samples what it would have sampled without them, before and after a weight swap."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fr_agents.models.compact import CompactCache, compact_prefill, opening_kv
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine
from tests.fr_agents.test_compact import VOCAB, llama, qwen2

torch.set_num_threads(1)

OPENING = list(range(10, 22))  # 12 tokens every prompt starts with


def prompts(n: int, seed: int) -> list[list[int]]:
    """``n`` prompts that share exactly :data:`OPENING`: prompt ``i`` goes on with its own token
    ``30 + i``, then random ones. (With random tokens alone, two prompts that the engine's timing
    happened to group shared a 13th token one time in 66, and that group kept a longer opening.)"""
    assert 30 + n <= VOCAB
    g = torch.Generator().manual_seed(seed)
    return [OPENING + [30 + i] + torch.randint(30, VOCAB, (i % 4,), generator=g).tolist() for i in range(n)]


def right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, lengths


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("past_len, prefix", [(12, 0), (7, 3), (2, 0)])
def test_a_prefill_after_kept_keys_and_values_equals_the_whole_prefill(
    build, past_len: int, prefix: int
) -> None:
    """Prefilling only what follows ``past_len`` kept tokens (with ``prefix`` more shared tokens run
    once) gives the same first logits and the same cache, slot for slot, as prefilling every token."""
    model = build(seed=3)
    rows = prompts(5, seed=1)
    ids, lengths = right_padded(rows)
    whole = CompactCache(model, len(rows), 32, torch.device("cpu"))
    want = compact_prefill(model, ids, lengths, 0, whole)
    past = opening_kv(model, torch.tensor(OPENING)).head(past_len)
    part = CompactCache(model, len(rows), 32, torch.device("cpu"))
    got = compact_prefill(model, ids[:, past_len:], lengths - past_len, prefix, part, past=past)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert part.lengths.tolist() == lengths.tolist()
    for a, b in zip(part.keys + part.values, whole.keys + whole.values, strict=True):
        for r, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(a[r, :, :n], b[r, :, :n], rtol=1e-4, atol=1e-5)


def staggered(engine: HFEngine, rows: list[list[int]], first_seed: int = 0) -> list:
    """The first two requests arrive together; the rest one by one while the batch decodes."""

    async def one(i: int, p: list[int]):
        await asyncio.sleep(0 if i < 2 else 0.004 * i)
        return await engine.generate(
            p, SamplingOptions(max_tokens=6, seed=first_seed + i, stop_token_ids=(7,))
        )

    async def go():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(rows)))

    return asyncio.run(go())


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_joiners_start_from_the_kept_opening_and_sample_what_whole_prefills_sample(build) -> None:
    """Two requests open a running batch (their shared opening is kept); the ones arriving after
    join one at a time and prefill only what follows the opening; every request draws the tokens
    and log-probs (float rounding) of transformers' waves, which prefill every prompt whole."""
    model = build(seed=4)
    rows = prompts(12, seed=2)
    engine = HFEngine(model, max_batch_size=4, batch_wait_s=0.001, max_wait_s=0.001)
    got = staggered(engine, rows)
    engine.close_sync()
    plain = HFEngine(model, max_batch_size=4, compact=False)
    want = staggered(plain, rows)
    plain.close_sync()
    assert engine.stats["joined"] > 0
    assert engine.opening.tokens == OPENING
    assert engine.stats["opening_tokens"] >= len(OPENING) * engine.stats["joined"] - len(OPENING)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-5, abs=1e-5)


def test_after_a_weight_swap_a_joiner_prefills_its_opening_under_the_new_weights() -> None:
    """The kept opening's keys and values are dropped at a swap: a request after it gets the
    log-probs of an engine that only ever held the new weights, not of the old opening's."""
    old, new = qwen2(seed=5), qwen2(seed=6)
    rows = prompts(6, seed=3)
    engine = HFEngine(old, max_batch_size=4, batch_wait_s=0.001, max_wait_s=0.001)
    staggered(engine, rows)  # keeps the opening under the old weights
    assert engine.opening.tokens == OPENING
    engine.set_weights(new.state_dict(), version=1)
    after = staggered(engine, rows, first_seed=100)
    engine.close_sync()
    fresh = HFEngine(qwen2(seed=6), max_batch_size=4, compact=False)
    want = staggered(fresh, rows, first_seed=100)
    fresh.close_sync()
    for a, b in zip(after, want, strict=True):
        assert a.token_ids == b.token_ids and set(a.versions) == {1}
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-5, abs=1e-5)
