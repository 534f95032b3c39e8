"""The warm start's expert demos of the Python-tool task are token-truthful: each demo is the token
sequence a rollout would hold, the tool result in it is what the sandbox printed, and the
supervised loss falls on the expert's replies only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fr_agents.config import ConfigError, load_config
from fr_agents.tree import TrajectoryTree
from tools_sandbox import SandboxLimits, create_sandbox
from tools_sandbox.bwrap import bwrap_available
from trainer.parts import build_rollout_side
from trainer.warm_start import DEMO_STORE, _collate, expert_demos

pytestmark = pytest.mark.bwrap

DEMOS = 6


@pytest.fixture(scope="module")
def tool_demos(tmp_path_factory: pytest.TempPathFactory):
    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"bwrap backend unavailable: {why}")
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("run")
    # nano: a smaller vocabulary, so longer replies than the preset's micro model
    overrides = [
        "model.tiny_size=nano",
        f"warm_start.examples={DEMOS}",
        "rollout.concurrency=3",
        "rollout.max_new_tokens=40",
    ]
    cfg = load_config("python-tool-tiny", overrides)
    side = build_rollout_side(cfg, run, with_engine=False)
    demos = expert_demos(cfg, side.runner, side.demo_tasks, run / DEMO_STORE)
    yield cfg, side, demos, run
    side.close()


def _printed(task: dict) -> str:
    """What the sandbox prints for the expert's code, run here in a fresh session."""
    meta = task["metadata"]
    sb = create_sandbox("bwrap", SandboxLimits(call_timeout=5.0))
    try:
        return sb.run_python(f"print({meta['a']}{meta['op']}{meta['b']})").stdout
    finally:
        sb.close()


def test_tool_demos_hold_what_the_sandbox_printed(tool_demos) -> None:
    cfg, side, demos, _ = tool_demos
    tok = side.tokenizer
    assert len(demos) == DEMOS, "the expert wins every demo episode"

    def text(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    by_prompt = {tuple(side.runner.encode_task(t)): t for t in side.demo_tasks}
    for demo in demos:
        prompt_len = demo.spans[0][0]
        task = by_prompt[tuple(demo.ids[:prompt_len])]  # the prompt is the rollout's own encoding
        printed = _printed(task)
        meta = task["metadata"]
        assert len(demo.spans) == 2
        (s0, e0), (s1, e1) = demo.spans
        call, response, answer = demo.ids[s0:e0], demo.ids[e0:s1], demo.ids[s1:e1]
        assert text(call) == f"<tool>print({meta['a']}*{meta['b']})</tool><|im_end|>"
        assert f"<tool_response>\n{printed.strip()}\n</tool_response>" in text(response)
        assert text(answer) == printed.strip() + "<|im_end|>"
        assert printed.strip() == task["answer"]
        assert e1 == len(demo.ids)
        # the whole sequence is the chat template of the conversation (what a rollout holds)
        messages = [
            {"role": "user", "content": task["prompt"]},
            {"role": "assistant", "content": text(call[:-1])},
            {"role": "user", "content": f"<tool_response>\n{printed.strip()}\n</tool_response>"},
            {"role": "assistant", "content": text(answer[:-1])},
        ]
        assert text(demo.ids) + "\n" == tok.apply_chat_template(messages, tokenize=False)


def test_tool_demos_are_stored_as_non_policy_demo_spans(tool_demos) -> None:
    _, _, demos, run = tool_demos
    with TrajectoryTree.open(run / DEMO_STORE) as tree:
        trajectories = tree.trajectories(tree.leaf_ids())
    assert sorted(t.token_ids for t in trajectories) == sorted(d.ids for d in demos)
    for t in trajectories:
        assert t.info["agent"] == "expert" and t.reward == 1.0 and t.info["tool_calls"] == 1
        assert not any(t.policy_mask), "scripted replies are never counted as sampled"
        assert [tuple(s) for s in t.info["demo_spans"]] == next(
            d.spans for d in demos if d.ids == t.token_ids
        )


def test_the_loss_falls_on_the_expert_replies_only(tool_demos) -> None:
    _, side, demos, _ = tool_demos
    ids, attn, labels = _collate(demos, side.runner.pad_id)
    for i, demo in enumerate(demos):
        on = {j for s, e in demo.spans for j in range(s, e)}
        assert [j for j in range(labels.shape[1]) if labels[i, j] != -100] == sorted(on)
        assert all(labels[i, j] == ids[i, j] for j in on)
        assert int(attn[i].sum()) == len(demo.ids)


def test_expert_replies_longer_than_the_policy_may_sample_are_refused(tool_demos, tmp_path: Path) -> None:
    cfg, side, _, _ = tool_demos
    short = load_config(
        "python-tool-tiny", ["model.tiny_size=nano", "warm_start.examples=2", "rollout.max_new_tokens=8"]
    )
    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokens: an expert reply is \d+ tokens"):
        expert_demos(short, side.runner, side.demo_tasks[:2], tmp_path / DEMO_STORE)


def test_expert_demos_need_an_env_with_an_expert(tmp_path: Path) -> None:
    cfg = load_config("math-tiny", ["warm_start.demos=expert", "model.tiny_size=nano"])
    with pytest.raises(ConfigError, match=r"MathVerifier-v0 \(warm_start\.demos=expert\) has no expert"):
        build_rollout_side(cfg, tmp_path, with_engine=False)


def test_a_branching_run_plays_each_expert_demo_once(tmp_path: Path) -> None:
    """RL episodes fork (rollout.branch_factor=4 at the answer turn, a tree budget); the expert's demo
    episodes do not: one demo per task, each a single path, as in a linear run."""
    ok, why = bwrap_available()
    if not ok:
        pytest.skip(f"bwrap backend unavailable: {why}")
    torch.set_num_threads(1)
    overrides = [
        "model.tiny_size=nano",
        "warm_start.examples=3",
        "rollout.concurrency=3",
        "rollout.max_new_tokens=40",
        "rollout.branch_factor=4",
        "rollout.branch_at=[1]",
        "rollout.tree_budget_tokens=500",
    ]
    cfg = load_config("python-tool-tiny", overrides)
    side = build_rollout_side(cfg, tmp_path, with_engine=False)
    try:
        demos = expert_demos(cfg, side.runner, side.demo_tasks, tmp_path / DEMO_STORE)
        with TrajectoryTree.open(tmp_path / DEMO_STORE) as tree:
            leaves = tree.leaf_ids()
            roots = {tree.trajectories([leaf])[0].path[0] for leaf in leaves}
    finally:
        side.close()
    assert len(demos) == 3
    assert len(leaves) == 3 and len(roots) == 3
