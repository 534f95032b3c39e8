"""Episode runner: token truth against a plain transformers forward, drift, budgets, branching."""

from __future__ import annotations

import asyncio
import threading

import gymnasium
import pytest
import rollout_envs
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fr_agents.models import create_tiny
from fr_agents.policy.base import SamplingOptions
from fr_agents.policy.hf import HFEngine
from fr_agents.rollout import (
    ObservationTypeError,
    RolloutOptions,
    TokenDriftError,
    run_episode,
    run_episodes_sync,
)
from fr_agents.tree import TrajectoryTree

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = create_tiny(tmp_path_factory.mktemp("tiny") / "m", size="micro", seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    return path, model, tok


def _make(env_id="fr_agents_test/Count-v0", **kw):
    return lambda: gymnasium.make(env_id, **kw)


def _recompute(path, tree, leaf_ids, temperature=1.0):
    """Behaviour log-probs recomputed by an independently loaded model, one plain forward each."""
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    worst = 0.0
    for leaf in leaf_ids:
        tr = tree.trajectory(leaf)
        ids = torch.tensor([tr.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(ref(ids).logits[0, :-1].float() / temperature, -1)
        target = ids[0, 1:]
        lp = logp.gather(1, target[:, None]).squeeze(1)
        mask = torch.tensor(tr.policy_mask[1:])
        stored = torch.tensor(tr.logprobs[1:], dtype=torch.float32)
        assert mask.sum() > 0
        worst = max(worst, (lp[mask] - stored[mask]).abs().max().item())
    return worst


def test_token_truth_multi_turn_concurrent(tiny):
    path, model, tok = tiny
    engine = HFEngine(model, tok, seed=1)
    tree = TrajectoryTree()
    opts = RolloutOptions(temperature=1.0, max_new_tokens=12, max_context=400, max_turns=3)
    res = run_episodes_sync(_make(), engine, tok, tree, 8, opts, seeds=list(range(8)))
    engine.close_sync()
    leaves = [leaf for r in res for leaf in r.leaves]
    assert len(leaves) == 8 and all(leaf.turns == 3 for leaf in leaves)
    assert engine.stats["waves"] < engine.stats["rows"]  # requests really were batched
    # Several turns per path: policy and observation tokens interleave.
    tr = tree.trajectory(leaves[0].leaf_id)
    runs = sum(1 for a, b in zip(tr.policy_mask, tr.policy_mask[1:], strict=False) if a != b)
    assert runs >= 4
    assert _recompute(path, tree, [leaf.leaf_id for leaf in leaves]) <= 1e-4


def test_token_truth_temperature(tiny):
    path, model, tok = tiny
    engine = HFEngine(model, tok, seed=2)
    tree = TrajectoryTree()
    opts = RolloutOptions(temperature=0.7, max_new_tokens=10, max_context=300, max_turns=2)
    res = run_episodes_sync(_make(), engine, tok, tree, 4, opts, seeds=[5, 6, 7, 8])
    engine.close_sync()
    ids = [leaf.leaf_id for r in res for leaf in r.leaves]
    assert _recompute(path, tree, ids, temperature=0.7) <= 1e-4


class _Recording:
    """A wrapper around an engine that keeps every Generation it returns (what was sampled)."""

    def __init__(self, engine):
        self.engine = engine
        self.generations = []

    async def generate(self, ids, options):
        gen = await self.engine.generate(ids, options)
        self.generations.append(gen)
        return gen

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _runs(mask):
    """``(start, stop, is_policy)`` of the maximal runs of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, bool(mask[start])))
            start = i
    return out


def test_held_tokens_equal_what_was_sampled(tiny):
    """The stored path is exactly prompt ids + sampled ids + templated observation ids, turn by turn:
    each policy run holds the very ids (and log-probs) the engine sampled, each other run the
    tokenizer's ids of the chat-template text around the observation."""
    _, model, tok = tiny
    engine = _Recording(HFEngine(model, tok, seed=3))
    tree = TrajectoryTree()
    events = []
    opts = RolloutOptions(max_new_tokens=8, max_context=300, max_turns=3)
    res = asyncio.run(
        run_episode(
            gymnasium.make("fr_agents_test/Count-v0"),
            engine,
            tok,
            tree,
            opts,
            seed=3,
            on_event=lambda k, e: events.append((k, e)),
        )
    )
    engine.engine.close_sync()
    tr = tree.trajectory(res.leaves[0].leaf_id)
    gens = engine.generations
    assert len(gens) == res.leaves[0].turns >= 2
    runs = _runs(tr.policy_mask)
    policy = [(a, b) for a, b, pol in runs if pol]
    other = [(a, b) for a, b, pol in runs if not pol]
    # every sampled token is held, in order, with its behaviour log-prob
    assert [tr.token_ids[a:b] for a, b in policy] == [list(g.token_ids) for g in gens]
    held_lp = [x for a, b in policy for x in tr.logprobs[a:b]]
    assert held_lp == pytest.approx([float(x) for g in gens for x in g.logprobs], abs=1e-6)
    # the prompt is the tokenizer's ids of the rendered prompt; observations the ids of their template text
    prompt = next(e for k, e in events if k == "prompt")
    assert runs[0][2] is False and tr.token_ids[: runs[0][1]] == tok.encode(
        prompt["text"], add_special_tokens=False
    )
    assert prompt["text"].startswith("<|im_start|>user\nWrite exactly")
    # the held text up to the last turn is the chat template of the conversation, and each
    # observation run holds the tokenizer's own ids of its text
    actions = [e["text"] for k, e in events if k == "action"]
    obs = [e["text"] for k, e in events if k == "observation"]
    messages = [{"role": "user", "content": prompt["observation"]}]
    for action, o in zip(actions[:-1], obs, strict=False):
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": o}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(tr.token_ids[: policy[-1][0]], skip_special_tokens=False) == rendered
    for a, b in other[1:]:
        text = tok.decode(tr.token_ids[a:b], skip_special_tokens=False)
        assert tr.token_ids[a:b] == tok.encode(text, add_special_tokens=False)
    assert len(other) == len(gens)  # the prompt, then one observation between consecutive turns
    assert len(tr.token_ids) == runs[-1][1]


DRIFT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n(earlier) ' + m['content'] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_that_rewrites_earlier_turns_raises_drift(tiny):
    path, model, _ = tiny
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = DRIFT_TEMPLATE
    engine = HFEngine(model, tok)
    opts = RolloutOptions(max_new_tokens=6, max_context=300, max_turns=3)
    with pytest.raises(TokenDriftError, match="turn 0") as e:
        asyncio.run(
            run_episode(
                gymnasium.make("fr_agents_test/Count-v0"), engine, tok, TrajectoryTree(), opts, seed=0
            )
        )
    engine.close_sync()
    assert e.value.turn == 0


def test_context_budget_truncates_with_partial_score(tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok)
    tree = TrajectoryTree()
    opts = RolloutOptions(max_new_tokens=16, max_context=60, max_turns=10, stop_token_ids=(10**6,))
    res = asyncio.run(
        run_episode(gymnasium.make("fr_agents_test/Count-v0", turns=10), engine, tok, tree, opts, seed=1)
    )
    engine.close_sync()
    leaf = res.leaves[0]
    assert leaf.status == "truncated" and leaf.info["truncated_by"] == "context"
    assert leaf.partial_score is not None and 0 < leaf.partial_score < 1
    tr = tree.trajectory(leaf.leaf_id)
    assert len(tr.token_ids) <= 60 and tr.status == "truncated"


def test_turn_reward_sum_and_last(tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok, seed=4)
    for mode in ("sum", "last"):
        opts = RolloutOptions(max_new_tokens=4, max_context=300, max_turns=3, turn_reward=mode)
        res = asyncio.run(
            run_episode(
                gymnasium.make("fr_agents_test/Count-v0"), engine, tok, TrajectoryTree(), opts, seed=2, task=1
            )
        )
        leaf = res.leaves[0]
        assert leaf.reward == (sum(leaf.rewards) if mode == "sum" else leaf.rewards[-1])
    engine.close_sync()


@pytest.mark.parametrize("env_id", ["fr_agents_test/Count-v0", "fr_agents_test/ForkCount-v0"])
def test_branching_shares_prefix(tiny, env_id):
    """K leaves per fork (replay-forking and env.fork()), prefix stored once, visible in stats."""
    _, model, tok = tiny
    engine = HFEngine(model, tok, seed=5)
    tree = TrajectoryTree()
    forks_before = rollout_envs.ForkableCountEnv.forks
    opts = RolloutOptions(max_new_tokens=6, max_context=300, max_turns=3, branch_factor=3, branch_at=(1,))
    res = run_episodes_sync(_make(env_id), engine, tok, tree, 2, opts, seeds=[10, 11])
    engine.close_sync()
    for r in res:
        assert len(r.leaves) == 3
        paths = [tree.trajectory(leaf.leaf_id) for leaf in r.leaves]
        first_turn_end = paths[0].policy_mask.index(False, paths[0].prompt_len + 1)
        assert all(p.token_ids[:first_turn_end] == paths[0].token_ids[:first_turn_end] for p in paths)
        assert len({p.path[1] for p in paths}) == 1  # the shared first turn is one node
    stats = tree.stats()
    assert stats["leaves"] == 6 and stats["sharing_ratio"] > 1.0
    if "Fork" in env_id:
        assert rollout_envs.ForkableCountEnv.forks - forks_before == 4


def test_non_str_observation_names_env(tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok)
    with pytest.raises(ObservationTypeError, match="fr_agents_test/IntObs-v0"):
        asyncio.run(
            run_episode(gymnasium.make("fr_agents_test/IntObs-v0"), engine, tok, TrajectoryTree(), seed=0)
        )
    engine.close_sync()


def test_bad_options():
    with pytest.raises(ValueError, match="max_context"):
        RolloutOptions(max_context=0)
    with pytest.raises(ValueError, match="turn_reward"):
        RolloutOptions(turn_reward="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        RolloutOptions(top_p=0.9)


def test_weight_swap_mid_generation_records_per_token_versions(tiny):
    path, model, tok = tiny
    import copy

    engine = HFEngine(copy.deepcopy(model), tok, seed=6)
    new = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    started = threading.Event()

    async def main():
        fut = engine.submit(
            tok.encode("Write exactly 3 words."), SamplingOptions(max_tokens=200, stop_token_ids=())
        )
        while engine.stats["steps"] < 5:
            await asyncio.sleep(0.001)
        started.set()
        await asyncio.to_thread(engine.set_weights, new, 7)
        return await asyncio.wrap_future(fut)

    gen = asyncio.run(main())
    assert started.is_set() and engine.version == 7
    assert gen.versions[0] == 0 and gen.versions[-1] == 7 and gen.version == 0
    assert gen.versions == sorted(gen.versions)
    # After the swap returns, fresh generations are sampled (and scored) by the new weights.
    prompt = tok.encode("Turn 1: again.")
    g2 = engine.generate_sync(prompt, SamplingOptions(max_tokens=5, stop_token_ids=()))
    engine.close_sync()
    ref = copy.deepcopy(model)
    ref.load_state_dict(new)
    with torch.no_grad():
        logp = torch.log_softmax(ref(torch.tensor([prompt + g2.token_ids])).logits[0].float(), -1)
    lp = logp[len(prompt) - 1 : -1].gather(1, torch.tensor(g2.token_ids)[:, None]).squeeze(1)
    assert g2.versions == [7] * 5
    assert (lp - torch.tensor(g2.logprobs)).abs().max() <= 1e-4


class _LoggedCountEnv(rollout_envs.CountEnv):
    """CountEnv that logs its calls; ``fail_at`` makes that step raise."""

    def __init__(self, turns: int, fail_at: int = 0) -> None:
        super().__init__(turns)
        self.calls: list[str] = []
        self.fail_at = fail_at

    def step(self, action):
        self.calls.append("step")
        if self.t + 1 == self.fail_at:
            raise RuntimeError("env broke")
        obs, reward, terminated, truncated, info = super().step(action)
        info.pop("partial_score")  # so that a cut by the turn limit asks partial_score()
        return obs, reward, terminated, truncated, info

    def partial_score(self) -> float:
        self.calls.append("closed partial_score" if "close" in self.calls else "partial_score")
        return 0.25

    def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize(
    ("turns", "max_turns", "fail_at", "expected", "status"),
    [
        (2, 5, 0, ["step", "step", "close"], "finished"),  # the env ends it
        (5, 1, 0, ["step", "partial_score", "close"], "truncated"),  # the turn limit: scored while open
        (5, 5, 2, ["step", "step", "close"], None),  # a step raises
    ],
)
def test_the_env_is_closed_once_when_its_episode_ends(tiny, turns, max_turns, fail_at, expected, status):
    _, model, tok = tiny
    engine = HFEngine(model, tok, seed=3)
    env = _LoggedCountEnv(turns, fail_at)
    opts = RolloutOptions(max_new_tokens=4, max_context=300, max_turns=max_turns)
    try:
        res = asyncio.run(run_episode(env, engine, tok, TrajectoryTree(), opts, seed=1, task=1))
    except RuntimeError as e:
        assert status is None and "env broke" in str(e)
    else:
        assert res.leaves[0].status == status
        if status == "truncated":
            assert res.leaves[0].partial_score == 0.25
    finally:
        engine.close_sync()
    assert env.calls == expected


def _texts(n=2000, seed=0):
    import random

    rng = random.Random(seed)
    parts = list("abc xyz 0123456789+-*/=?!.,\n\t  ") + [
        "<|im_end|>",
        "<|im_start|>",
        "<|endoftext|>",
        "é",
        "日本",
        "🙂",
        "\u200b",
        "\r\n",
        "What is ",
        " assistant",
    ]
    return ["".join(rng.choice(parts) for _ in range(rng.randrange(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m"])
def test_the_direct_tokenizer_path_gives_the_wrappers_ids_and_text(tiny, name):
    """Encoding through the fast tokenizer's backend gives exactly the ids and the decoded text of
    transformers' own ``encode`` / ``decode`` (the rollout's one prompt encoder relies on it)."""
    from fr_agents.models.resolve import load_tokenizer
    from fr_agents.rollout.encoding import decode, direct_backend, encode_exact

    tok = tiny[2] if name == "tiny" else load_tokenizer(name)
    assert direct_backend(tok) is not None  # both of the project's tokenizers take the direct path
    for text in _texts():
        want = tok.encode(text, add_special_tokens=False)
        back = tok.decode(want, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:  # not round-trippable: both paths refuse it the same way
            with pytest.raises(TokenDriftError):
                encode_exact(tok, text, 0)
            continue
        assert encode_exact(tok, text, 0) == want
        assert decode(tok, want) == back


def test_a_tokenizer_left_truncating_or_overridden_goes_through_the_wrapper(tiny):
    """The direct path is refused where the wrapper would do something else: a backend left with
    truncation or padding configured, and a tokenizer class that overrides ``encode``."""
    from fr_agents.rollout.encoding import direct_backend, encode_exact

    tok = AutoTokenizer.from_pretrained(tiny[0])
    text = "What is 12 + 7? " * 4
    full = tok.encode(text, add_special_tokens=False)
    tok.backend_tokenizer.enable_truncation(max_length=3)
    assert direct_backend(tok) is None
    assert encode_exact(tok, text, 0) == full  # the wrapper resets truncation per call: all ids
    tok.backend_tokenizer.no_truncation()
    tok.backend_tokenizer.enable_padding(length=64)
    assert direct_backend(tok) is None
    assert encode_exact(tok, text, 0) == full
    tok.backend_tokenizer.no_padding()
    assert direct_backend(tok) is not None

    class Shouting(type(tok)):
        def encode(self, text, *a, **kw):
            return super().encode(text.upper(), *a, **kw)

    loud = Shouting.from_pretrained(tiny[0])
    assert direct_backend(loud) is None
    with pytest.raises(TokenDriftError):  # its own encode ran: the upper-cased ids do not decode back
        encode_exact(loud, "what is 1 + 2?", 0)
