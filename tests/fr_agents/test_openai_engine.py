"""OpenAIEngine against a real HTTP server on 127.0.0.1 (serving the tiny model)."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
import rollout_envs  # noqa: F401  (registers the test envs)
import torch
from openai_server import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine
from fr_agents.policy.openai_engine import OpenAIEngine, OpenAIEngineError
from fr_agents.rollout import RolloutOptions, run_episodes_sync
from fr_agents.tree import TrajectoryTree

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    hf = HFEngine(model, tok)
    srv = serve(hf)
    yield path, tok, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    hf.close_sync()


def test_rollout_through_openai_server_is_token_truthful(server):
    path, tok, url = server
    engine = OpenAIEngine(url, "tiny")
    tree = TrajectoryTree()
    opts = RolloutOptions(max_new_tokens=8, max_context=300, max_turns=2)
    res = run_episodes_sync(
        lambda: gymnasium.make("fr_agents_test/Count-v0"), engine, tok, tree, 4, opts, seeds=[1, 2, 3, 4]
    )
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for r in res:
        tr = tree.trajectory(r.leaves[0].leaf_id)
        ids = torch.tensor([tr.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(ref(ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None]).squeeze(1)
        mask = torch.tensor(tr.policy_mask[1:])
        assert (logp[mask] - torch.tensor(tr.logprobs[1:])[mask]).abs().max() <= 1e-4


def test_errors_are_clear(server):
    _, _, url = server
    with pytest.raises(OpenAIEngineError, match="HTTP 400"):
        asyncio.run(OpenAIEngine(url, "other-model").generate([1, 2], SamplingOptions(max_tokens=2)))
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("127.0.0.1:8000", "tiny")
    with pytest.raises(NotImplementedError, match="cannot load weights"):
        OpenAIEngine(url, "tiny").set_weights({}, 1)
    with pytest.raises(OpenAIEngineError, match="token_id"):
        OpenAIEngine.parse({"choices": [{"logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}}]}, 0)
