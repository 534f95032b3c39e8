"""Scripted actors (``--agent expert``): expert replies are stored as tokens, never as policy samples."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import rollout_envs
import torch
from transformers import AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.rollout import NoExpertError, RolloutOptions, expert_actor, has_expert, run_episode
from fr_agents.tree import TrajectoryTree

torch.set_num_threads(1)


class ExpertCountEnv(rollout_envs.CountEnv):
    """CountEnv whose expert always writes the target number of words."""

    def expert_action(self) -> str:
        return " ".join(["word"] * self.target)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(
        create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="nano", seed=0)
    )


def test_expert_replies_are_stored_as_non_policy_demo_tokens(tok: Any) -> None:
    tree = TrajectoryTree()
    env = ExpertCountEnv(turns=3)
    opts = RolloutOptions(max_context=600, max_turns=3)
    seen: list[str] = []

    def on_event(kind: str, ev: dict) -> None:
        if kind == "prompt" or (kind == "observation" and not ev["done"]):
            seen.append(ev["observation"] if kind == "prompt" else ev["text"])

    res = asyncio.run(
        run_episode(env, None, tok, tree, opts, seed=4, task=3, actor=expert_actor, on_event=on_event)
    )
    leaf = res.leaves[0]
    assert leaf.reward == 3.0 and leaf.turns == 3 and leaf.policy_tokens == 0
    tr = tree.trajectory(leaf.leaf_id)
    # Not one token is a policy sample: no behaviour log-prob, no policy version.
    assert not any(tr.policy_mask) and set(tr.versions) == {-1}
    assert tree.root_meta(tr.root_id)["agent"] == "expert"
    assert tr.info["agent"] == "expert" and len(tr.info["demo_spans"]) == 3
    # The spans are exactly the expert's replies plus the end-of-turn token a policy would sample.
    for start, end in tr.info["demo_spans"]:
        assert tok.decode(tr.token_ids[start:end]) == "word word word<|im_end|>"
    # Token truth: the path is exactly the chat template's rendering of the conversation played.
    msgs = [{"role": "user", "content": seen[0]}]
    for obs in seen[1:]:
        msgs += [{"role": "assistant", "content": "word word word"}, {"role": "user", "content": obs}]
    msgs.append({"role": "assistant", "content": "word word word"})
    assert tok.decode(tr.token_ids) + "\n" == tok.apply_chat_template(msgs, tokenize=False)


def test_env_without_expert_is_named_in_the_error(tok: Any) -> None:
    env = rollout_envs.CountEnv()
    assert not has_expert(env) and has_expert(ExpertCountEnv())
    with pytest.raises(NoExpertError, match="CountEnv has no expert"):
        asyncio.run(
            run_episode(env, None, tok, TrajectoryTree(), RolloutOptions(), seed=0, actor=expert_actor)
        )


def test_engine_or_actor_is_required(tok: Any) -> None:
    with pytest.raises(ValueError, match="engine: give an engine or a scripted actor"):
        asyncio.run(run_episode(ExpertCountEnv(), None, tok, TrajectoryTree(), RolloutOptions(), seed=0))
