"""The one-step learner on a tiny Qwen2 in float64: micro-batching, packing, temperature, guards."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from fr_agents.config import config_from_dict
from fr_agents.tree.batch import FlatBatch, PackedBatch, build_flat, build_packed
from fr_agents.tree.nodes import Trajectory
from tests.trainer.learners import make_learner
from trainer.learner import Learner, NonFiniteLossError

torch.set_num_threads(1)

VOCAB = 300


def tiny_model(attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=0.3,  # peaky enough that probabilities are not all ~1/V
        attn_implementation=attn,
    )
    return Qwen2ForCausalLM(cfg).to(torch.float64)


def _tree_paths() -> list[tuple[int, list[tuple[int, list[int], bool]]]]:
    """Leaves as (root id, [(node id, tokens, is_policy)]), sharing prompts and branch prefixes.

    Two prompts; prompt 1 branches after a shared policy segment, and one leaf is multi-turn
    (policy, observation, policy).
    """
    p1 = (1, [5, 17, 33, 2, 9], False)
    p2 = (2, [8, 8, 41], False)
    shared = (3, [101, 55, 7], True)
    return [
        (1, [p1, shared, (4, [12, 13], True)]),
        (1, [p1, shared, (5, [200, 201, 202, 203], True)]),
        (1, [p1, shared, (6, [77], True), (7, [250, 251, 252], False), (8, [30, 31, 32], True)]),
        (1, [p1, (9, [99, 98, 97, 96, 95, 94, 93], True)]),
        (2, [p2, (10, [1, 2], True)]),
        (2, [p2, (11, [150, 151, 152, 153, 154, 155], True), (12, [60], False), (13, [61, 62], True)]),
        (2, [p2, (14, [3], True)]),
        (2, [p2, (15, [270, 271, 272, 273, 274, 275, 276, 277, 278], True)]),
    ]


def make_trajectories(
    model: torch.nn.Module, temperature: float = 1.0, noise: float = 0.05, rewards: list[float] | None = None
) -> list[Trajectory]:
    """Trajectories whose behaviour log-probs are the model's own (at ``temperature``) plus noise."""
    rewards = rewards or [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    trajs = []
    for leaf, ((root, nodes), reward) in enumerate(zip(_tree_paths(), rewards, strict=True)):
        ids: list[int] = []
        mask: list[bool] = []
        path: list[int] = []
        offsets: list[int] = []
        for node, toks, policy in nodes:
            path.append(node)
            offsets.append(len(ids))
            ids.extend(toks)
            mask.extend([policy] * len(toks))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1] / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        # Deterministic per-token perturbation, the same wherever a token is shared.
        wobble = [noise * math.sin(7.0 * pos + tok) for pos, tok in enumerate(ids)]
        logprobs = [0.0] + [min(0.0, float(v) + w) for v, w in zip(lp, wobble[1:], strict=True)]
        logprobs = [x if m else 0.0 for x, m in zip(logprobs, mask, strict=True)]
        trajs.append(
            Trajectory(
                leaf_id=100 + leaf,
                root_id=root,
                token_ids=ids,
                logprobs=logprobs,
                policy_mask=mask,
                versions=[0 if m else -1 for m in mask],
                reward=reward,
                partial_score=None,
                status="finished",
                info={},
                prompt_len=len(nodes[0][1]),
                path=path,
                offsets=offsets,
            )
        )
    return trajs


@torch.no_grad()
def params_close(a: torch.nn.Module, b: torch.nn.Module, tol: float) -> float:
    worst = 0.0
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb
        worst = max(worst, float((pa - pb).abs().max()))
    assert worst <= tol, f"parameters differ by {worst}"
    return worst


@torch.no_grad()
def moved(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((pa - pb).abs().max()) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


CONFIGS = [
    {},
    {"negative_token_fraction": 0.5, "aggregation": "token_mean"},
    {"importance_sampling": False, "delta": math.inf},
    {"algo": "grpo"},
]


@pytest.mark.parametrize("switches", CONFIGS, ids=["default", "filter+token_mean", "no_is", "grpo"])
def test_micro_batched_step_equals_full_batch_step(switches: dict) -> None:
    model = tiny_model()
    trajs = make_trajectories(model)
    ref = copy.deepcopy(model)
    switches = {"delta": 0.05, **switches}
    full = make_learner(ref, lr=1e-2, micro_batch_tokens=0, **switches)
    micro = make_learner(model, lr=1e-2, micro_batch_tokens=24, **switches)
    s_full = full.step(build_flat(trajs))
    s_micro = micro.step(build_flat(trajs))
    assert s_full["micro_batches"] == 1 and s_micro["micro_batches"] >= 4
    assert s_micro["forward_tokens"] < s_full["forward_tokens"]  # trimmed padding
    for key in ("loss", "grad_norm", "acceptance_rate", "seq_kl_mean", "ratio_max", "retained_tokens"):
        assert s_micro[key] == pytest.approx(s_full[key], rel=1e-9, abs=1e-12), key
    assert moved(ref, tiny_model()) > 1e-4  # the step really moved the weights
    params_close(model, ref, 1e-6)
    if switches.get("negative_token_fraction"):
        assert s_full["retained_fraction"] < 1.0
    if switches.get("algo") == "grpo":
        assert "clip_fraction" in s_full


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_step_equals_flat_step(attn: str) -> None:
    model = tiny_model(attn)
    trajs = make_trajectories(model)
    ref = copy.deepcopy(model)
    packed_batch = build_packed(trajs)
    assert isinstance(packed_batch, PackedBatch)
    # SGD, not Adam: transformers' Qwen2 runs RMSNorm (and eager softmax) in float32 even in a
    # float64 model, so packed and flat gradients agree to ~1e-7 relative, not 1e-15; Adam's
    # sign-like first step would amplify that noise on near-zero gradient entries.
    kw = {"delta": 0.05, "negative_token_fraction": 0.5}
    # tree_min_saving=0: tree attention even on these short rows (where the dense mask is cheaper)
    s_packed = make_learner(
        model, torch.optim.SGD(model.parameters(), lr=1e-2), tree_min_saving=0, **kw
    ).step(packed_batch)
    s_flat = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), micro_batch_tokens=30, **kw).step(
        build_flat(trajs)
    )
    assert s_packed["packed"] == 1.0 and s_flat["packed"] == 0.0
    assert s_packed["tree_attention"] == float(attn == "sdpa")  # eager models keep the dense mask
    assert s_packed["forward_tokens"] < sum(len(t.token_ids) for t in trajs)  # shared tokens once
    for key in ("loss", "grad_norm", "seq_kl_max", "ratio_mean", "retained_tokens"):
        assert s_packed[key] == pytest.approx(s_flat[key], rel=1e-6, abs=1e-9), key
    params_close(model, ref, 1e-6)
    assert packed_batch.consumed


class _NoLogitsToKeep(Qwen2ForCausalLM):
    """A FAKE older-style model: its forward refuses ``logits_to_keep`` (a fault the installed
    transformers cannot produce: all its causal LMs take it)."""

    def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        if "logits_to_keep" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        return super().forward(*args, **kwargs)


def test_packed_step_of_a_model_without_logits_to_keep_equals_the_usual_packed_step() -> None:
    src = tiny_model("eager")
    model = _NoLogitsToKeep(src.config).to(torch.float64)
    model.load_state_dict(src.state_dict())
    trajs = make_trajectories(model)
    ref = copy.deepcopy(src)
    s_fallback = make_learner(model, torch.optim.SGD(model.parameters(), lr=1e-2), delta=0.05).step(
        build_packed(trajs)
    )
    s_usual = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), delta=0.05).step(
        build_packed(trajs)
    )
    assert s_fallback["packed"] == 1.0 and s_fallback["tree_attention"] == 0.0
    assert s_fallback["loss"] == pytest.approx(s_usual["loss"], rel=1e-12)
    assert moved(model, src) > 1e-4
    params_close(model, ref, 1e-12)


def test_packed_batch_over_budget_falls_back_to_flat_micro_batches() -> None:
    model = tiny_model()
    trajs = make_trajectories(model)
    stats = make_learner(model, micro_batch_tokens=20).step(build_packed(trajs))
    assert stats["packed"] == 0.0 and stats["micro_batches"] > 1
    never = make_learner(tiny_model(), packed="never").step(build_packed(trajs))
    assert never["packed"] == 0.0


def _wide_tree(leaves: int = 16, prompt: int = 40, tail: int = 40) -> list[Trajectory]:
    """One root whose ``leaves`` branches share a ``prompt``-token opening: a wide packed row."""
    from fr_agents.tree import TrajectoryTree

    tree = TrajectoryTree()
    root = tree.add_root([(7 * i) % (VOCAB - 1) + 1 for i in range(prompt)])
    ids = []
    for j in range(leaves):
        toks = [(3 * i + 5 * j) % (VOCAB - 1) + 1 for i in range(tail)]
        ids.append(tree.finish(tree.append(root, toks, [-1.0] * tail, True, 0), float(j % 2)))
    return tree.trajectories(ids)


def test_a_packed_step_takes_tree_attention_only_where_it_saves_enough_scores() -> None:
    kw = {"delta": math.inf}
    # short rows (the shared test trees): the dense per-root mask computes few more scores
    short = make_trajectories(tiny_model())
    packed = build_packed(short)
    roots = list(range(len(packed.root_spans)))
    dense = len(roots) * packed.max_root_tokens**2
    assert dense < 2 * packed.tree_layout(roots).scores
    s_short = make_learner(tiny_model(), torch.optim.SGD(tiny_model().parameters(), lr=0.0), **kw).step(
        packed
    )
    assert s_short["packed"] == 1.0 and s_short["tree_attention"] == 0.0
    # one wide row of 16 branches: tree attention computes > 2x fewer scores than the dense mask
    wide = build_packed(_wide_tree())
    assert len(wide.root_spans) == 1 and wide.max_root_tokens**2 >= 2 * wide.tree_layout([0]).scores
    model, ref = tiny_model(), tiny_model()
    s_tree = make_learner(model, torch.optim.SGD(model.parameters(), lr=1e-2), **kw).step(wide)
    s_dense = make_learner(ref, torch.optim.SGD(ref.parameters(), lr=1e-2), tree_attention=False, **kw).step(
        build_packed(_wide_tree())
    )
    assert s_tree["tree_attention"] == 1.0 and s_dense["tree_attention"] == 0.0
    assert s_tree["loss"] == pytest.approx(s_dense["loss"], rel=1e-9)
    params_close(model, ref, 1e-9)


def test_log_probs_are_recomputed_at_the_sampling_temperature() -> None:
    model = tiny_model()
    trajs = make_trajectories(model, temperature=0.7, noise=0.0)
    at_temp = make_learner(copy.deepcopy(model), temperature=0.7).step(build_flat(trajs))
    # Behaviour log-probs are stored as float32: ratios are 1 to float32 precision.
    assert at_temp["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert at_temp["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert at_temp["seq_kl_max"] < 1e-9
    assert at_temp["acceptance_rate"] == 1.0
    wrong = make_learner(copy.deepcopy(model), temperature=1.0, delta=math.inf).step(build_flat(trajs))
    assert abs(wrong["ratio_mean"] - 1.0) > 1e-3
    assert wrong["seq_kl_max"] > 1e-4


def test_one_optimizer_step_then_the_batch_is_consumed() -> None:
    model = tiny_model()
    learner = make_learner(model, lr=1e-2)
    batch = build_flat(make_trajectories(model))
    stats = learner.step(batch)
    assert batch.consumed and learner.version == 1 and stats["version"] == 1.0
    steps = {int(s["step"]) for s in learner.optimizer.state.values()}
    assert steps == {1}
    snapshot = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match="consumed"):
        learner.step(batch)
    params_close(model, snapshot, 0.0)
    assert {int(s["step"]) for s in learner.optimizer.state.values()} == {1}


def test_the_default_optimizer_is_fused_adamw_and_steps_as_the_unfused_one() -> None:
    model = tiny_model()
    trajs = make_trajectories(model)
    fused = make_learner(copy.deepcopy(model), lr=1e-2, weight_decay=0.1)
    assert fused.optimizer.defaults["fused"] is True
    plain = Learner(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1))
    assert not plain.optimizer.defaults["fused"]
    for _ in range(3):
        fused.step(build_flat(trajs))
        plain.step(build_flat(trajs))
    params_close(fused.model, model, 1e-12)


def test_a_step_raises_rewarded_log_probs_and_lowers_penalised_ones() -> None:
    model = tiny_model()
    trajs = make_trajectories(model, noise=0.0, rewards=[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    before = build_flat(trajs)
    learner = make_learner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), grad_clip=0.0)
    learner.step(build_flat(trajs))
    with torch.no_grad():
        after = before.gather_logprobs(model(input_ids=before.token_ids).logits)
    gain = ((after - before.behavior_logprobs.double()) * before.action_mask).sum(dim=1)
    assert gain[0] > 0  # the only rewarded trajectory became more likely
    assert gain[1:].mean() < 0


def test_a_progress_paid_row_trains_its_replies_after_the_last_progress_as_unpaid() -> None:
    """``rollout.reward: progress``: every row paid 1 leaves nothing to learn, except the reply that
    a cut row made after its last progress (paid 0, so measured against the batch mean of 1): that
    reply alone becomes less likely. Under ``partial`` the same batch is all zero advantages."""
    model = tiny_model()
    trajs = make_trajectories(model, noise=0.0, rewards=[1.0] * 8)
    cut = trajs[2]  # prompt, reply 1 (tokens 5-8), an observation (9-11), reply 2 (12-14)
    cut.status, cut.partial_score, cut.info = "truncated", 1.0, {"progress_turn": 1}
    batch = build_flat(trajs, "progress")
    assert batch.credit_ends.tolist() == [len(t.token_ids) for t in trajs[:2]] + [12] + [
        len(t.token_ids) for t in trajs[3:]
    ]
    before = build_flat(trajs, "progress")
    learner = make_learner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), grad_clip=0.0)
    stats = learner.step(batch)
    # logged per row (the mean over its policy tokens): the cut row's 4 paid and 3 unpaid tokens
    assert stats["adv_min"] == pytest.approx(-3 / 7) and stats["adv_max"] == pytest.approx(0.0)
    policy = sum(sum(t.policy_mask) for t in trajs)
    assert stats["unpaid_tokens"] == pytest.approx(3 / policy)  # reply 2's tokens of all the batch's
    with torch.no_grad():
        after = before.gather_logprobs(model(input_ids=before.token_ids).logits)
    gain = (after - before.behavior_logprobs.double()) * before.action_mask
    assert gain[2, 12:15].sum() < -1e-3  # the unpaid reply
    assert gain[2, 12:15].sum() < gain[2, 5:9].sum()  # below the paid reply of the same row
    flat = make_learner(tiny_model(), grad_clip=0.0).step(build_flat(trajs, "partial"))
    assert flat["grad_norm"] == 0.0


def test_non_finite_loss_is_refused_before_stepping() -> None:
    model = tiny_model()
    snapshot = copy.deepcopy(model)
    learner = make_learner(model, lr=1e-2)
    batch = build_flat(make_trajectories(model))
    # Finite rewards whose advantage times log-prob overflows: the loss is -inf.
    batch.rewards = torch.tensor([1.7e308] + [0.0] * 7, dtype=torch.float64)
    with pytest.raises(NonFiniteLossError) as info:
        learner.step(batch)
    assert info.value.batch is batch
    assert not batch.consumed and learner.version == 0
    assert all(p.grad is None for p in model.parameters())
    params_close(model, snapshot, 0.0)
    assert not learner.optimizer.state
    # Rewards whose mean overflows give non-finite advantages: refused the same way.
    batch.rewards = torch.tensor([1e308, -1e308] * 4, dtype=torch.float64)
    with pytest.raises(NonFiniteLossError):
        learner.step(batch)
    params_close(model, snapshot, 0.0)


def test_diverged_weights_raise_non_finite_loss_error() -> None:
    model = tiny_model()
    trajs = make_trajectories(model)
    with torch.no_grad():
        model.model.norm.weight[0] = math.nan
    with pytest.raises(NonFiniteLossError):
        Learner(model).step(build_flat(trajs))


def test_from_config_applies_every_switch() -> None:
    cfg = config_from_dict(
        {
            "rollout": {"temperature": 0.8},
            "objective": {
                "delta": 0.01,
                "importance_sampling": False,
                "aggregation": "token_mean",
                "negative_token_fraction": 0.25,
                "negative_min_prob": 0.02,
                "negative_min_prob_scope": "suffix",
            },
            "optim": {
                "lr": 3e-3,
                "grad_clip": 0.5,
                "scheduler": "cosine",
                "warmup_steps": 2,
                "spike_clip": 1.5,
                "spike_window": 20,
            },
            "trainer": {"micro_batch_tokens": 64, "packed": "never", "steps": 10},
        }
    )
    model = tiny_model()
    learner = Learner.from_config(model, cfg)
    assert (
        learner.policy.config.temperature == 0.8
        and learner.objective.delta == 0.01
        and not learner.objective.importance_sampling
    )
    assert learner.objective.aggregation == "token_mean" and learner.objective.negative_token_fraction == 0.25
    assert (
        learner.objective.negative_min_prob == 0.02 and learner.objective.negative_min_prob_scope == "suffix"
    )
    assert (
        learner.chunking.micro_batch_tokens == 64
        and learner.optim.grad_clip == 0.5
        and learner.chunking.packed == "never"
    )
    assert learner.scheduler is not None
    assert learner.spike is not None and learner.spike.k == 1.5 and learner.spike.window == 20
    stats = learner.step(build_packed(make_trajectories(model, temperature=0.8)))
    assert stats["lr"] == pytest.approx(3e-3 / 2)  # first warm-up step
    assert stats["packed"] == 0.0
    grpo = Learner.from_config(tiny_model(), config_from_dict({"objective": {"algo": "grpo"}}))
    assert grpo.objective.algo == "grpo"
    out = grpo.step(build_flat(make_trajectories(model)))
    assert 0.0 <= out["clip_fraction"] <= 1.0


def test_stats_cover_the_logged_quantities() -> None:
    model = tiny_model()
    stats = Learner(model).step(build_flat(make_trajectories(model)))
    for key in (
        "loss",
        "acceptance_rate",
        "seq_kl_mean",
        "seq_kl_max",
        "ratio_mean",
        "ratio_max",
        "adv_mean",
        "adv_std",
        "adv_min",
        "adv_max",
        "retained_tokens",
        "retained_fraction",
        "grad_norm",
        "lr",
        "staleness_max",
    ):
        assert key in stats and isinstance(stats[key], float), key
    assert stats["adv_mean"] == pytest.approx(0.0, abs=1e-12)
    assert stats["staleness_max"] == 0.0


def test_malformed_batches_are_rejected_naming_the_field() -> None:
    model = tiny_model()
    batch = build_flat(make_trajectories(model))
    bad = FlatBatch(**{**batch.__dict__, "action_mask": batch.action_mask.clone()})
    bad.action_mask[0, 0] = True
    with pytest.raises(ValueError, match="action_mask"):
        Learner(model).step(bad)
    bad = FlatBatch(**{**batch.__dict__, "rewards": torch.tensor([1.0])})
    with pytest.raises(ValueError, match="rewards"):
        Learner(model).step(bad)
    with pytest.raises(ValueError, match="algo"):
        make_learner(model, algo="ppo")
    assert not batch.consumed


def test_policy_logits_equal_the_plain_forward_with_a_shared_prefix() -> None:
    """The learner's forward (a prefix every row shares run once, the head only on columns that can
    hold a policy token) gives the plain forward's log-probs and gradients (float32: the shared
    prefix is taken there; float64 is the reference precision and never shares it)."""
    from fr_agents.models.forward import policy_logits
    from fr_agents.models.forward import shared_prefix as _shared_prefix

    torch.manual_seed(3)
    rows = []
    for i in range(6):  # a 4-token shared opening, prompts of different lengths, right padding
        prompt = [7, 8, 9, 10] + [20 + i] * (1 + i % 3)
        rows.append((prompt, [100 + i, 101, 102 + i][: 1 + i % 3]))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids, dtype=torch.bool)
    act = torch.zeros_like(attn)
    for r, (p, a) in enumerate(rows):
        ids[r, : len(p) + len(a)] = torch.tensor(p + a)
        attn[r, : len(p) + len(a)] = True
        act[r, len(p) : len(p) + len(a)] = True
    first = int(act.any(0).nonzero()[0])
    assert _shared_prefix(ids, attn, first - 1) == 4  # the shared path is taken

    def grads(fast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model = tiny_model().to(torch.float32)
        if fast:
            start, logits = policy_logits(model, ids, attn, act)
        else:
            start, logits = 1, model(input_ids=ids, attention_mask=attn.long()).logits[:, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, start:, None])[..., 0]
        lp = torch.cat([torch.zeros(len(rows), start), lp], dim=1) * act
        (lp.sum(1) * torch.linspace(-1, 1, len(rows))).sum().backward()
        return lp.detach(), [p.grad for p in model.parameters()]

    lp_fast, g_fast = grads(True)
    lp_plain, g_plain = grads(False)
    torch.testing.assert_close(lp_fast, lp_plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_fast, g_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_acceptance_is_also_reported_per_sign_of_the_advantage() -> None:
    """acceptance_positive / acceptance_negative: the admitted share of the rows above and below the
    baseline, computed here from each row's own sequence KL against the gate."""
    from trainer.objective import binary_kl

    model = tiny_model()
    trajs = make_trajectories(model, noise=0.3)
    flat = build_flat(trajs)
    with torch.no_grad():
        lp = flat.gather_logprobs(model(input_ids=flat.token_ids, attention_mask=flat.attention_mask).logits)
    mask = flat.action_mask
    d = binary_kl(flat.behavior_logprobs.where(mask, 0.0), lp.where(mask, 0.0)).where(mask, 0.0)
    kl = (d.sum(-1) / mask.sum(-1)).clamp_min(0.0)
    delta = float(kl.median())
    admitted = kl <= delta
    adv = flat.rewards - flat.rewards.mean()
    stats = make_learner(model, delta=delta).step(flat)
    assert stats["acceptance_positive"] == pytest.approx(float(admitted[adv > 0].float().mean()))
    assert stats["acceptance_negative"] == pytest.approx(float(admitted[adv < 0].float().mean()))
    assert 0.0 < stats["acceptance_rate"] < 1.0
    same = Learner(tiny_model()).step(build_flat(make_trajectories(model, rewards=[1.0] * 8)))
    assert math.isnan(same["acceptance_positive"]) and math.isnan(same["acceptance_negative"])


@pytest.mark.parametrize("switches", CONFIGS, ids=["default", "filter+token_mean", "no_is", "grpo"])
def test_a_compact_forward_step_equals_a_transformers_forward_step(switches: dict) -> None:
    """model.compact_forward: a float32 step through fr_agents.models.compact gives transformers'
    step (statistics and updated weights, up to float32 rounding), micro-batched or not; false (or
    a model it does not handle) takes transformers' forward and says why."""
    for micro in (0, 24):
        model = tiny_model().to(torch.float32)
        ref = copy.deepcopy(model)
        trajs = make_trajectories(model)
        switches = {"delta": 0.05, **switches}
        # plain SGD: the weights move by lr x gradient (Adam's normalisation would magnify float32
        # rounding in near-zero gradient entries)
        compact = make_learner(
            model, torch.optim.SGD(model.parameters(), lr=1.0), micro_batch_tokens=micro, **switches
        )
        plain = make_learner(
            ref,
            torch.optim.SGD(ref.parameters(), lr=1.0),
            micro_batch_tokens=micro,
            compact_forward=False,
            **switches,
        )
        assert compact.policy.compact_reason is None and "compact_forward" in plain.policy.compact_reason
        s_compact = compact.step(build_flat(trajs))
        s_plain = plain.step(build_flat(trajs))
        for key in ("loss", "grad_norm", "acceptance_rate", "seq_kl_mean", "ratio_max", "retained_tokens"):
            assert s_compact[key] == pytest.approx(s_plain[key], rel=1e-4, abs=1e-6), key
        assert moved(ref, tiny_model().to(torch.float32)) > 1e-4
        params_close(model, ref, 1e-5)
    assert "float32" in Learner(tiny_model().to(torch.float64)).policy.compact_reason
    off = Learner.from_config(
        tiny_model().to(torch.float32), config_from_dict({"model": {"compact_forward": False}})
    )
    assert off.policy.compact_reason == "model.compact_forward is false"
    assert (
        Learner.from_config(tiny_model().to(torch.float32), config_from_dict({})).policy.compact_reason
        is None
    )
