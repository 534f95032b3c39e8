"""HFEngine's on_token hook sees every sampled token, in order, and changes nothing sampled."""

from __future__ import annotations

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


def test_on_token_streams_exactly_the_sampled_tokens(nano) -> None:
    model, tok = nano
    prompt = tok.encode("12+7=", add_special_tokens=False)
    opts = SamplingOptions(temperature=1.0, max_tokens=12, seed=3)
    seen: list[int] = []
    streaming = HFEngine(model, tok, seed=5, on_token=seen.append)
    plain = HFEngine(model, tok, seed=5)
    try:
        streamed = streaming.generate_sync(prompt, opts)
        reference = plain.generate_sync(prompt, opts)
    finally:
        streaming.close_sync()
        plain.close_sync()
    assert seen == streamed.token_ids
    assert streamed.token_ids == reference.token_ids
    assert streamed.logprobs == reference.logprobs
