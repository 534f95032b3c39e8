"""In-turn branching (``rollout.branch_policy=token``): a reply is sampled once and forked at its
highest-entropy tokens; the continuations share the reply's head in the store.

Real parts throughout: the in-code tiny Qwen2, the hf engine, the SQLite trajectory store and a
forkable multi-turn test env."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
import rollout_envs  # noqa: F401  (registers the test envs)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine
from fr_agents.policy.seeded import SeededEngine
from fr_agents.rollout import RolloutOptions, run_episode
from fr_agents.rollout.branching import fork_positions
from fr_agents.tree import TrajectoryTree

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(
        path
    )


def test_fork_positions_are_the_top_entropy_tokens_above_the_floor_in_reply_order() -> None:
    ent = [0.1, 2.0, 0.5, 2.0, 1.5, 0.0]
    assert fork_positions(ent, 2, 0.0) == [1, 3]  # a tie goes to the earlier token
    assert fork_positions(ent, 3, 0.0) == [1, 3, 4]
    assert fork_positions(ent, 3, 1.9) == [1, 3]  # below the floor: never a fork point
    assert fork_positions(ent, 10, 0.0) == [0, 1, 2, 3, 4, 5]
    assert fork_positions([], 3, 0.0) == []
    assert fork_positions(ent, 0, 0.0) == []


def test_the_hf_engine_reports_each_sampled_tokens_entropy_under_the_tempered_distribution(tiny) -> None:
    model, tok = tiny
    engine = HFEngine(model, tok, seed=0)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(text, add_special_tokens=False).input_ids
    temperature = 0.7
    gen = engine.generate_sync(
        prompt,
        SamplingOptions(temperature=temperature, max_tokens=8, entropies=True, stop_token_ids=(10**6,)),
    )
    plain = engine.generate_sync(prompt, SamplingOptions(temperature=temperature, max_tokens=8))
    engine.close_sync()
    assert len(gen.entropies) == len(gen.token_ids) == 8
    assert plain.entropies == []  # only when asked for
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen.token_ids[:-1]])).logits[0, len(prompt) - 1 :]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    expected = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(torch.tensor(gen.entropies), expected, atol=1e-4)


def _episode(engine, tok, opts, seed=3):
    tree = TrajectoryTree()
    env = gymnasium.make("fr_agents_test/ForkCount-v0")
    view = SeededEngine(engine, lambda n: 1000 + n)
    events: list[tuple[str, dict]] = []
    res = asyncio.run(
        run_episode(env, view, tok, tree, opts, seed=seed, on_event=lambda k, p: events.append((k, p)))
    )
    return tree, res, events


def test_a_fork_at_a_high_entropy_token_shares_the_reply_up_to_it(tiny) -> None:
    """The first leaf is the reply as first sampled; each continuation holds that reply's tokens up
    to its fork point (the positions of the reply's highest-entropy tokens, recomputed here from
    the model), the store shares them (the fork point is a node boundary both paths pass through
    unchanged), and every leaf counts only the tokens it sampled itself."""
    model, tok = tiny
    opts = RolloutOptions(
        max_new_tokens=8,
        max_context=300,
        max_turns=1,
        branch_factor=3,
        branch_at=(0,),
        branch_policy="token",
        branch_entropy=0.0,
        stop_token_ids=(10**6,),
        temperature=1.0,
    )
    engine = HFEngine(model, tok, seed=0)
    before = engine.stats["tokens"]
    tree, res, events = _episode(engine, tok, opts)
    sampled = engine.stats["tokens"] - before
    engine.close_sync()
    forks = [p for k, p in events if k == "fork"]
    assert len(forks) == 1 and len(forks[0]["positions"]) == 2
    first, *rest = tree.trajectories([x.leaf_id for x in res.leaves])
    start = first.prompt_len
    reply = first.token_ids[start:]
    assert len(reply) == 8 and all(first.policy_mask[start:])
    with torch.no_grad():  # the reply's entropies, recomputed: the fork points are its top two
        logits = model(torch.tensor([first.token_ids[:-1]])).logits[0, start - 1 :]
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropies = (-(logp.exp() * logp).sum(-1)).tolist()
    assert forks[0]["positions"] == fork_positions(entropies, 2, 0.0)
    assert len(rest) == 2
    for at, cont in zip(forks[0]["positions"], rest, strict=True):
        assert (
            cont.token_ids[: start + at] == first.token_ids[: start + at]
        )  # the shared head, token for token
        assert cont.logprobs[: start + at] == first.logprobs[: start + at]  # the same sample, not a re-score
        if cont.token_ids != first.token_ids:
            assert (
                start + at in cont.offsets and start + at in first.offsets
            )  # the store split at the fork point
            shared = cont.offsets.index(start + at)
            assert cont.path[:shared] == first.path[:shared]  # one stored copy of the head
    leaves = {x.leaf_id: x for x in res.leaves}
    assert [x.sampled_tokens for x in res.leaves] == [
        8,
        8 - forks[0]["positions"][0],
        8 - forks[0]["positions"][1],
    ]
    assert sum(x.sampled_tokens for x in res.leaves) == sampled
    assert all(x.policy_tokens == 8 for x in leaves.values())


def test_no_token_above_the_floor_means_no_fork(tiny) -> None:
    model, tok = tiny
    opts = RolloutOptions(
        max_new_tokens=6,
        max_context=300,
        max_turns=1,
        branch_factor=3,
        branch_at=(0,),
        branch_policy="token",
        branch_entropy=1e9,
    )
    engine = HFEngine(model, tok, seed=0)
    _, res, events = _episode(engine, tok, opts)
    engine.close_sync()
    assert len(res.leaves) == 1
    assert [p["positions"] for k, p in events if k == "fork"] == [[]]


def test_in_turn_forks_reproduce_with_the_same_seeds(tiny) -> None:
    model, tok = tiny
    opts = RolloutOptions(
        max_new_tokens=6,
        max_context=300,
        max_turns=2,
        branch_factor=2,
        branch_at=(0, 1),
        branch_policy="token",
        branch_entropy=0.0,
    )
    engine = HFEngine(model, tok, seed=0)
    runs = [_episode(engine, tok, opts) for _ in range(2)]
    engine.close_sync()
    tokens = [
        [t.token_ids for t in tree.trajectories([x.leaf_id for x in res.leaves])] for tree, res, _ in runs
    ]
    assert tokens[0] == tokens[1]
    assert len(tokens[0]) == 4  # 2 ** len(branch_at): each path forks again inside its second reply


def test_the_token_policy_needs_an_engine_that_reports_entropies() -> None:
    from fr_agents.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.branch_policy"):
        load_config(
            "math-tiny",
            [
                "rollout.engine=vllm",
                "rollout.branch_policy=token",
                "rollout.branch_factor=2",
                "rollout.branch_at=[0]",
                "trainer.batch_size=32",
            ],
        )
    cfg = load_config(
        "math-tiny",
        [
            "rollout.branch_policy=token",
            "rollout.branch_factor=2",
            "rollout.branch_at=[0]",
            "trainer.batch_size=32",
        ],
    )
    assert cfg.rollout.branch_policy == "token"
