"""HFEngine's seeded sampling (one generator per request, as training uses it): draws follow the
tempered distribution, log-probs are that distribution's, and a seed gives the same token whatever
else shares the wave."""

from __future__ import annotations

import asyncio

import pytest
import torch

from fr_agents.models import create_tiny, load_policy
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    torch.set_num_threads(1)
    return load_policy(
        str(create_tiny(tmp_path_factory.mktemp("nano") / "m", size="nano", seed=0)), "float32"
    )


def _first_tokens(
    engine: HFEngine, prompt: list[int], seeds: list[int], temperature: float
) -> list[tuple[int, float]]:
    async def one(seed: int) -> tuple[int, float]:
        g = await engine.generate(prompt, SamplingOptions(temperature=temperature, max_tokens=1, seed=seed))
        return g.token_ids[0], g.logprobs[0]

    async def go() -> list[tuple[int, float]]:
        return list(await asyncio.gather(*(one(s) for s in seeds)))

    return asyncio.run(go())


def test_seeded_draws_follow_the_tempered_distribution(nano) -> None:
    model, tok = nano
    prompt = tok.encode("12+7=", add_special_tokens=False)
    temperature = 0.05  # the untrained nano model is near-flat; this gives cells of 20%, 13%, 11%, ...
    with torch.no_grad():
        logp = torch.log_softmax(
            model(input_ids=torch.tensor([prompt])).logits[0, -1].float() / temperature, -1
        )
    engine = HFEngine(model, tok, seed=0)
    try:
        draws = _first_tokens(engine, prompt, list(range(3000)), temperature)
        again = _first_tokens(engine, prompt, [7, 11, 2999], temperature)  # other waves, other companions
    finally:
        engine.close_sync()
    for t, lp in draws:
        assert lp == pytest.approx(float(logp[t]), abs=1e-5)
    # Compare on the 8 likeliest tokens and "the rest" (per-token frequencies of a near-flat
    # 1024-token distribution are too noisy at 3000 draws; these 9 cells are not).
    p = logp.exp().double()
    top = torch.argsort(p, descending=True)[:8]
    counts = torch.bincount(torch.tensor([t for t, _ in draws]), minlength=p.shape[0]).double() / len(draws)
    want = torch.cat([p[top], (1 - p[top].sum()).reshape(1)])
    got = torch.cat([counts[top], (1 - counts[top].sum()).reshape(1)])
    assert float(want[:8].sum()) > 0.5  # the cells carry real mass
    tv = 0.5 * float((got - want).abs().sum())
    assert tv < 0.04, f"total variation {tv:.3f} between the draws and the tempered distribution"
    # same tokens; the log-probs agree to float rounding (another batch shape, other kernels)
    assert [t for t, _ in again] == [draws[i][0] for i in (7, 11, 2999)]
    assert [lp for _, lp in again] == pytest.approx([draws[i][1] for i in (7, 11, 2999)], abs=1e-5)


def test_a_wave_whose_prompts_share_an_opening_runs_it_once_and_each_row_sees_its_own_prompt(nano) -> None:
    """Prompts of different lengths that start alike: the shared opening is prefilled once for the
    wave, and every sampled token's log-prob is the one a plain forward of that row alone gives."""
    model, tok = nano
    opening = tok.encode("Q: what is", add_special_tokens=False)
    prompts = [
        opening + tok.encode(q, add_special_tokens=False) for q in (" 1+1?", " 23*4 + 5?", " 7?", " 100-1?")
    ]
    assert len({len(p) for p in prompts}) > 1
    engine = HFEngine(model, tok, seed=0, batch_wait_s=0.5)  # the four requests make one wave

    async def go() -> list:
        opts = [SamplingOptions(temperature=1.0, max_tokens=5, seed=i) for i in range(len(prompts))]
        return list(
            await asyncio.gather(*(engine.generate(p, o) for p, o in zip(prompts, opts, strict=True)))
        )

    try:
        gens = asyncio.run(go())
    finally:
        engine.close_sync()
    assert engine.stats["waves"] == 1
    common = 0  # the prompts' longest common prefix (at least the opening)
    while all(len(p) > common + 1 and p[common] == prompts[0][common] for p in prompts):
        common += 1
    assert common >= len(opening) and engine.stats["shared_prefill_tokens"] == common
    for prompt, g in zip(prompts, gens, strict=True):
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(g.token_ids)]
        assert g.logprobs == pytest.approx(want, abs=1e-5)


def test_a_wave_whose_prompts_share_less_than_two_tokens_prefills_them_whole(nano) -> None:
    model, tok = nano
    prompts = [tok.encode(q, add_special_tokens=False) for q in ("1+1=", "9*9=")]
    assert prompts[0][0] != prompts[1][0]
    engine = HFEngine(model, tok, seed=0, batch_wait_s=0.5)

    async def go() -> list:
        return list(
            await asyncio.gather(
                *(engine.generate(p, SamplingOptions(max_tokens=2, seed=3)) for p in prompts)
            )
        )

    try:
        gens = asyncio.run(go())
    finally:
        engine.close_sync()
    assert engine.stats["waves"] == 1 and engine.stats["shared_prefill_tokens"] == 0
    assert all(len(g.token_ids) == 2 for g in gens)
