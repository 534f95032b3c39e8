"""fr_agents.models.compact: the learner's compact forward against transformers' own forward."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from fr_agents.models.compact import compact_logits, compact_logits_at, compact_reason

torch.set_num_threads(1)

VOCAB = 96


def qwen2(seed: int = 0, layers: int = 3) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    return Qwen2ForCausalLM(cfg)


def llama(seed: int = 0, **extra) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        initializer_range=0.3,
        **extra,
    )
    return LlamaForCausalLM(cfg)


def ragged_rows(shared: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows: ``shared`` common leading tokens, prompts and replies of different
    lengths; returns ids, attention mask and the policy-token mask."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(7):
        prompt = list(range(5, 5 + shared)) + torch.randint(10, VOCAB, (2 + i % 3,), generator=g).tolist()
        reply = torch.randint(10, VOCAB, (1 + i % 4,), generator=g).tolist()
        rows.append((prompt, reply))
    width = max(len(p) + len(a) for p, a in rows) + 1  # one all-padding column at the end
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids, dtype=torch.bool)
    act = torch.zeros_like(attn)
    for r, (p, a) in enumerate(rows):
        ids[r, : len(p) + len(a)] = torch.tensor(p + a)
        attn[r, : len(p) + len(a)] = True
        act[r, len(p) : len(p) + len(a)] = True
    return ids, attn, act


def logprobs_and_grads(model, ids, attn, act, compact: bool, prefix: int):
    """Policy-token log-probs and every parameter's gradient of a weighted sum of them."""
    model.zero_grad(set_to_none=True)
    first = int(act.any(0).nonzero()[0])
    keep = torch.arange(first - 1, ids.shape[1] - 1)
    if compact:
        logits = compact_logits(model, ids, keep, prefix)
    else:
        logits = model(input_ids=ids, attention_mask=attn.long(), logits_to_keep=keep).logits
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, first:, None])[..., 0] * act[:, first:]
    (lp.sum(1) * torch.linspace(-1, 1, ids.shape[0])).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Equal up to float32 rounding, measured against the tensor's own scale (gradients summed over
    a batch in a different order differ by ~1e-6 of their largest entry)."""
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()) + 1e-7, msg=name)


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("shared", [0, 1, 4])
def test_compact_logits_and_gradients_equal_transformers_forward(build, shared: int) -> None:
    """Every policy token's log-prob and every parameter's gradient match the plain forward, with a
    shared opening run once or not, rows of different lengths and a padding-only last column."""
    model = build()
    assert compact_reason(model) is None
    ids, attn, act = ragged_rows(shared)
    first = int(act.any(0).nonzero()[0])
    for prefix in sorted({0, shared}):
        assert prefix <= first - 1
        lp_c, g_c = logprobs_and_grads(model, ids, attn, act, True, prefix)
        lp_t, g_t = logprobs_and_grads(model, ids, attn, act, False, 0)
        torch.testing.assert_close(lp_c, lp_t, rtol=1e-5, atol=1e-5)
        assert g_c.keys() == g_t.keys() and len(g_c) == len(list(model.parameters()))
        for name in g_t:
            close(g_c[name], g_t[name], name)


def test_compact_logits_one_layer_model_and_prefix_bounds() -> None:
    """A one-layer model (its only layer is the trimmed last one) matches too; a prefix past the
    first kept column is refused by name."""
    model = qwen2(layers=1)
    ids, attn, act = ragged_rows(3)
    lp_c, g_c = logprobs_and_grads(model, ids, attn, act, True, 3)
    lp_t, g_t = logprobs_and_grads(model, ids, attn, act, False, 0)
    torch.testing.assert_close(lp_c, lp_t, rtol=1e-5, atol=1e-5)
    for name in g_t:
        close(g_c[name], g_t[name], name)
    keep = torch.arange(4, ids.shape[1] - 1)
    with pytest.raises(ValueError, match="prefix"):
        compact_logits(model, ids, keep, 5)


def multi_turn_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows sharing a 4-token opening whose policy tokens come in two replies with an
    observation between them, one row much longer than the rest (most of the batch is padding)."""
    g = torch.Generator().manual_seed(seed)
    spans = [
        (3, 2, 1, 2),
        (2, 1, 2, 1),
        (4, 3, 2, 30),
        (1, 2, 1, 1),
        (3, 1, 3, 2),
    ]  # prompt, reply, obs, reply
    width = 4 + max(sum(x) for x in spans) + 5
    ids = torch.zeros(len(spans), width, dtype=torch.long)
    attn = torch.zeros_like(ids, dtype=torch.bool)
    act = torch.zeros_like(attn)
    for r, parts in enumerate(spans):
        n = 4 + sum(parts)
        ids[r, :4] = torch.arange(5, 9)
        ids[r, 4:n] = torch.randint(10, VOCAB, (n - 4,), generator=g)
        attn[r, :n] = True
        at = 4 + parts[0]
        act[r, at : at + parts[1]] = True
        at += parts[1] + parts[2]
        act[r, at : at + parts[3]] = True
    return ids, attn, act


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("prefix", [0, 4])
def test_logits_at_the_policy_columns_and_gradients_equal_transformers_forward(build, prefix: int) -> None:
    """compact_logits_at (the learner's flat forward): the logits that predict each policy token of
    multi-turn rows of very different lengths, and every parameter's gradient through them, match
    transformers' forward of the padded batch."""
    model = build()
    ids, attn, act = multi_turn_rows()
    rows, cols = act[:, 1:].nonzero(as_tuple=True)
    weights = torch.linspace(-1, 1, rows.shape[0])
    got = {}
    for name, run in (
        ("compact", lambda: compact_logits_at(model, ids, rows, cols, prefix)),
        ("transformers", lambda: model(input_ids=ids, attention_mask=attn.long()).logits[rows, cols]),
    ):
        model.zero_grad(set_to_none=True)
        logits = run()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[rows, cols + 1, None])[:, 0]
        (lp * weights).sum().backward()
        got[name] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(got["compact"][0], got["transformers"][0], rtol=1e-5, atol=1e-5)
    for name, want in got["transformers"][1].items():
        close(got["compact"][1][name], want, name)


def test_logits_at_compute_no_padding_and_refuse_bad_columns_by_name() -> None:
    """The products a batch costs do not grow with the padding after its rows (each row runs only
    through its last asked column); one more real token does cost more. Unsorted, out-of-range or
    pre-prefix columns are refused by name."""
    from torch.utils.flop_counter import FlopCounterMode

    model = qwen2()
    ids, _, act = multi_turn_rows()
    rows, cols = act[:, 1:].nonzero(as_tuple=True)

    def flops(ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> int:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            compact_logits_at(model, ids, rows, cols, 4)
        return counter.get_total_flops()

    wider = torch.cat([ids, torch.zeros(ids.shape[0], 40, dtype=torch.long)], dim=1)
    assert flops(wider, rows, cols) == flops(ids, rows, cols)
    short = rows != 2  # drop the long row's last asked column: it runs one token less
    last = int((rows == 2).nonzero()[-1])
    fewer = torch.ones_like(rows, dtype=torch.bool)
    fewer[last] = False
    assert flops(ids, rows[fewer], cols[fewer]) < flops(ids, rows, cols)
    assert flops(ids, rows[short], cols[short]) < flops(ids, rows[fewer], cols[fewer])
    with pytest.raises(ValueError, match="sorted"):
        compact_logits_at(model, ids, rows.flip(0), cols.flip(0))
    with pytest.raises(ValueError, match="outside"):
        compact_logits_at(model, ids, rows, cols + ids.shape[1])
    with pytest.raises(ValueError, match="prefix"):
        compact_logits_at(model, ids, rows, cols, int(cols.min()) + 1)
    with pytest.raises(ValueError, match="rows"):
        compact_logits_at(model, ids, rows[:0], cols[:0])


def test_compact_reason_names_what_it_does_not_handle() -> None:
    """Only float32 (or bfloat16) Qwen2/Llama with SiLU, default rotary embeddings and no sliding
    window qualify."""
    assert "float32" in compact_reason(qwen2().to(torch.float64))
    assert "rotary" in compact_reason(
        llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    )
    assert "hidden_act" in compact_reason(llama(hidden_act="gelu"))
    assert "attention_dropout" in compact_reason(llama(attention_dropout=0.1))
    sliding = qwen2()
    sliding.config.use_sliding_window = True
    assert "sliding" in compact_reason(sliding)
    assert "not one of" in compact_reason(torch.nn.Linear(2, 2))


def _generate(engine, prompts: list[list[int]], max_tokens: int, stop: list[int]) -> list:
    import asyncio

    from fr_agents.policy.base import SamplingOptions

    async def go() -> list:
        return list(
            await asyncio.gather(
                *(
                    engine.generate(
                        p,
                        SamplingOptions(temperature=1.0, max_tokens=max_tokens, seed=i, stop_token_ids=stop),
                    )
                    for i, p in enumerate(prompts)
                )
            )
        )

    try:
        return asyncio.run(go())
    finally:
        engine.close_sync()


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("shared", [0, 3])
def test_engine_waves_through_the_compact_forward_sample_what_transformers_does(build, shared: int) -> None:
    """HFEngine's compact waves (right-padded prefill, preallocated cache, rows dropped as they
    finish) draw the same tokens with the same log-probs (float rounding) as its transformers
    waves, seeded, for prompts of different lengths with or without a shared opening."""
    from fr_agents.policy.hf import HFEngine

    model = build(seed=1)
    g = torch.Generator().manual_seed(5)
    prompts = [
        list(range(5, 5 + shared)) + torch.randint(10, VOCAB, (1 + i % 5,), generator=g).tolist()
        for i in range(9)
    ]
    stop = [7, 8]  # token ids that end a row early, so rows leave the wave at different steps
    compact = HFEngine(model, max_batch_size=16, batch_wait_s=0.05)
    plain = HFEngine(model, max_batch_size=16, batch_wait_s=0.05, compact=False)
    assert compact.compact_reason is None and plain.compact_reason == "compact is off"
    got = _generate(compact, prompts, 6, stop)
    want = _generate(plain, prompts, 6, stop)
    assert compact.stats["waves"] == 1 and compact.stats["shared_prefill_tokens"] == (
        shared if shared >= 2 else 0
    )
    assert {len(x.token_ids) for x in want} != {6}  # some rows stopped early
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert "float32" in HFEngine(build().to(torch.float64)).compact_reason


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_requests_queued_while_a_compact_batch_decodes_join_it_and_sample_what_transformers_does(
    build,
) -> None:
    """A compact batch of 3 places takes the 6 requests queued behind its first 3 into the places
    finished rows leave (one running batch, rows moved as others finish, a newcomer longer than the
    cache's slots), and every request gets the tokens and log-probs (float rounding) of the
    transformers waves that run them 3 at a time."""
    from fr_agents.policy.hf import HFEngine

    model = build(seed=2)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(10, VOCAB, (1 + (i * 3) % 7,), generator=g).tolist() for i in range(9)]
    prompts[-1] = prompts[-1] + list(range(10, 40))  # longer than any slot the first rows needed
    stop = [7, 8, 9]
    compact = HFEngine(model, max_batch_size=3, batch_wait_s=0.05)
    plain = HFEngine(model, max_batch_size=3, batch_wait_s=0.05, compact=False)
    got = _generate(compact, prompts, 8, stop)
    want = _generate(plain, prompts, 8, stop)
    assert compact.stats["waves"] == 1 and compact.stats["joined"] == 6 and compact.stats["rows"] == 9
    assert plain.stats["waves"] == 3 and plain.stats["joined"] == 0
    assert len({len(x.token_ids) for x in want}) > 1  # rows left at different steps
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_running_batch_that_starts_with_one_row_grows_its_cache_as_requests_arrive() -> None:
    """Requests arriving one by one: the batch starts with one row and its cache grows (doubling, up
    to max_batch_size) as they join; every request samples what transformers' waves sample."""
    import asyncio

    from fr_agents.policy.base import SamplingOptions
    from fr_agents.policy.hf import HFEngine

    model = qwen2(seed=2)

    async def staggered(engine):
        async def one(i):
            await asyncio.sleep(0.002 * i)
            return await engine.generate(
                list(range(10, 12 + i % 5)), SamplingOptions(max_tokens=12, seed=i, stop_token_ids=(7,))
            )

        try:
            return await asyncio.gather(*(one(i) for i in range(20)))
        finally:
            await engine.close()

    compact = HFEngine(model, max_batch_size=8, batch_wait_s=0.001, max_wait_s=0.001)
    got = asyncio.run(staggered(compact))
    want = asyncio.run(staggered(HFEngine(model, max_batch_size=8, compact=False)))
    assert compact.stats["joined"] > 0 and compact.stats["rows"] == 20
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        # batch shapes here follow arrival timing on both sides: float32 rounding, relative to the value
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("build", [qwen2, llama], ids=["qwen2", "llama"])
def test_a_bfloat16_copy_runs_the_compact_generation_forward_with_bfloat16_rounding(build) -> None:
    """A bfloat16 copy of the policy (``rollout.dtype``) qualifies for the compact prefill and
    decode, and their logits are as close to float32's as transformers' own bfloat16 forward's are
    (bfloat16 rounding, not a wrong formula: those differ from float32 by ~1-8% of the logits' scale)."""
    from fr_agents.models.compact import CompactCache, compact_decode, compact_prefill, fused_weights

    model = build(seed=3)
    half = build(seed=3).to(torch.bfloat16)
    assert compact_reason(half) is None
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(10, VOCAB, (4, 6), generator=g)
    lengths = torch.tensor([6, 3, 5, 4])
    nxt = torch.randint(10, VOCAB, (4,), generator=g)
    ours, theirs = [], []
    with torch.no_grad():
        cache = CompactCache(half, 4, 8, ids.device)
        first = compact_prefill(half, ids, lengths, 0, cache, fused_weights(half)).float()
        second = compact_decode(half, nxt, cache, fused_weights(half)).float()
        for r in range(4):
            x = torch.cat([ids[r, : int(lengths[r])], nxt[r : r + 1]])[None]
            want = model(input_ids=x).logits[0, -2:]
            ours.append(float((torch.stack([first[r], second[r]]) - want).abs().max()))
            theirs.append(float((half(input_ids=x).logits[0, -2:].float() - want).abs().max()))
    assert max(ours) <= 1.5 * max(theirs), (ours, theirs)


@pytest.mark.parametrize("on", [True, False])
def test_model_compact_forward_reaches_the_rollout_engine_and_both_evaluations(on: bool, tmp_path) -> None:
    """model.compact_forward is read by every HF engine a run builds: the rollout's, the held-out
    evaluation's and the periodic evaluation's (the learner's is tested in test_learner.py)."""
    from envs.benches import eval_bench_for
    from fr_agents.config import config_from_dict
    from fr_agents.eval.periodic import PeriodicEval
    from fr_agents.policy.hf import HFEngine
    from trainer.episodes import make_engine
    from trainer.evaluate import HeldOutEval

    cfg = config_from_dict(
        {"model": {"compact_forward": on}, "trainer": {"eval_episodes": 5, "eval_every": 2, "eval_k": 2}}
    )
    engine = make_engine(cfg, "unused", None, model=qwen2())
    try:
        assert isinstance(engine, HFEngine) and (engine.compact_reason is None) == on
    finally:
        engine.close_sync()
    bench = eval_bench_for(cfg)
    assert HeldOutEval.from_config(cfg, tmp_path, bench).settings.compact == on
    assert PeriodicEval.from_config(cfg, tmp_path, bench).settings.compact == on


def test_the_dry_run_plan_names_the_forward_a_run_takes(tmp_path) -> None:
    """--dry-run's placement plan says which forward the learner and the hf engine will run, from the
    config and the model's config.json (no weights loaded), and why not the compact one."""
    from fr_agents.config import config_from_dict
    from trainer.preflight import dry_run_report, forward_plan

    assert forward_plan(config_from_dict({})) == (
        "forward: fr_agents.models.compact (model.compact_forward) in the learner's "
        "flat and tree-packed steps (float32) and the hf engine's running batches (float32)"
    )
    assert forward_plan(config_from_dict({"rollout": {"dtype": "bfloat16"}})).endswith(
        "the learner's flat and tree-packed steps (float32) and the hf engine's running batches (bfloat16)"
    )
    assert forward_plan(config_from_dict({"rollout": {"dtype": "float16"}})) == (
        "forward: fr_agents.models.compact (model.compact_forward) in the learner's "
        "flat and tree-packed steps (float32); transformers' in the hf engine's running batches "
        "(rollout.dtype is float16; the compact forward needs float32 or bfloat16)"
    )
    assert "(model.compact_forward is false)" in forward_plan(
        config_from_dict({"model": {"compact_forward": False}})
    )
    assert "model.dtype is float64" in forward_plan(config_from_dict({"model": {"dtype": "float64"}}))
    qwen_dir, rope_dir = tmp_path / "qwen", tmp_path / "rope"
    qwen2().config.save_pretrained(qwen_dir)
    llama(
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    ).config.save_pretrained(rope_dir)
    qwen = config_from_dict({"model": {"name": str(qwen_dir)}})
    assert forward_plan(qwen).startswith("forward: fr_agents.models.compact")
    assert "- " + forward_plan(qwen) in dry_run_report(qwen)
    plan = forward_plan(config_from_dict({"model": {"name": str(rope_dir)}}))
    assert plan.startswith("forward: transformers'") and "rotary embeddings 'linear'" in plan


# --------------------------------------------------------------------------- packed tree rows


def shared_opening_trees(vocab: int, seed: int = 0):
    """Three multi-turn episode trees whose prompts open with the same 6 tokens: each root's first
    reply forks into siblings after an observation, one of them into two more turns. Returns the
    packed batch of every leaf and its flat form."""
    from fr_agents.tree import TrajectoryTree

    g = torch.Generator().manual_seed(seed)

    def toks(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=g).tolist()

    tree = TrajectoryTree()
    leaves = []
    for r in range(3):
        root = tree.add_root([5, 6, 7, 8, 9, 10, *toks(2 + r)])
        turn = tree.append(root, toks(3), [-0.5] * 3, True, 0)
        obs = tree.append(turn, toks(4), None, False, 0)
        for k in range(2 + r % 2):
            reply = tree.append(obs, toks(2 + k), [-0.7] * (2 + k), True, 0)
            if k == 0:  # this branch plays two more turns
                more = tree.append(tree.append(reply, toks(3), None, False, 0), toks(3), [-0.6] * 3, True, 0)
                leaves.append(tree.finish(more, 0.25 * r))
            else:
                leaves.append(tree.finish(reply, 1.0 - 0.3 * k))
    return tree.export_packed(leaves), tree.export_flat(leaves)


@pytest.mark.parametrize("build", [qwen2, llama])
def test_packed_tree_rows_through_the_compact_forward_equal_transformers_forward(build) -> None:
    """compact_tree_logits_at, the shared opening once across roots, against transformers' forward
    over the same packed rows with their dense ancestor masks: logits and every gradient."""
    from fr_agents.models.compact import compact_tree_logits_at

    model = build(seed=3).float()
    packed, _ = shared_opening_trees(VOCAB)
    roots = list(range(len(packed.root_spans)))
    part = packed.root_chunk(roots, torch.float32)
    ids, pos = part["input_ids"], part["position_ids"]
    allowed = packed.ancestor_mask(roots)
    need = torch.unique(part["prev"][packed.flat.action_mask[part["rows"]]])
    rows, cols = need // ids.shape[1], need % ids.shape[1]
    weight = torch.linspace(-1, 1, need.numel())[:, None]

    def run(compact: bool, prefix: int = 0):
        model.zero_grad(set_to_none=True)
        if compact:
            logits = compact_tree_logits_at(model, ids, pos, allowed, rows, cols, prefix)
        else:
            logits = model(input_ids=ids, position_ids=pos, attention_mask=part["attention_mask"]).logits[
                rows, cols
            ]
        (torch.log_softmax(logits, -1) * weight).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want, want_g = run(False)
    for prefix in (0, 6):
        got, got_g = run(True, prefix)
        close(got, want, f"logits, prefix {prefix}")
        assert got_g.keys() == want_g.keys()
        for name in want_g:
            close(got_g[name], want_g[name], f"{name}, prefix {prefix}")
    with pytest.raises(ValueError, match="prefix"):  # the 7th column differs between the roots
        compact_tree_logits_at(model, ids, pos, allowed, rows, cols, 7)


def test_packed_roots_of_one_leaf_each_run_the_flat_forward_with_its_one_causal_mask() -> None:
    """A linear batch in packed form (each root one path): compact_tree_logits_at gives exactly
    compact_logits_at's logits over the same rows (the causal path, no mask per row); a batch with
    one branching root keeps the ancestor masks, and still equals transformers' forward."""
    from fr_agents.models.compact import compact_tree_logits_at
    from fr_agents.tree import TrajectoryTree

    model = qwen2(seed=4).float()
    g = torch.Generator().manual_seed(2)

    def toks(n: int) -> list[int]:
        return torch.randint(10, VOCAB, (n,), generator=g).tolist()

    tree, leaves = TrajectoryTree(), []
    for r in range(3):
        root = tree.add_root([5, 6, 7, 8, *toks(2 + r)])
        obs = tree.append(tree.append(root, toks(3 + r), [-0.5] * (3 + r), True, 0), toks(4), None, False, 0)
        leaves.append(tree.finish(tree.append(obs, toks(2), [-0.4] * 2, True, 0), 0.5))

    def asked(packed):
        roots = list(range(len(packed.root_spans)))
        part = packed.root_chunk(roots, torch.float32)
        need = torch.unique(part["prev"][packed.flat.action_mask[part["rows"]]])
        w = part["input_ids"].shape[1]
        return part, packed.ancestor_mask(roots), need // w, need % w

    class MaskShapes(torch.overrides.TorchFunctionMode):
        """Records the attention mask's shape of every fused attention call (observes only)."""

        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.scaled_dot_product_attention:
                self.shapes.append(tuple(kwargs["attn_mask"].shape))
            return func(*args, **kwargs)

    def per_row(shapes: list[tuple[int, ...]], b: int) -> int:
        """How many attention calls took a mask per row ([B, ...])."""
        return sum(len(shape) > 2 and shape[0] == b for shape in shapes)

    part, allowed, rows, cols = asked(tree.export_packed(leaves))
    ids, pos = part["input_ids"], part["position_ids"]
    with torch.no_grad():
        for prefix in (0, 4):
            with MaskShapes() as seen:
                got = compact_tree_logits_at(model, ids, pos, allowed, rows, cols, prefix)
            assert torch.equal(got, compact_logits_at(model, ids, rows, cols, prefix)), prefix
            # every layer but the last attends under one [L, S] causal mask for all rows; the last
            # runs only the kept queries, a few per row, under their rows of it ([B, 1, kept, S])
            assert per_row(seen.shapes, ids.shape[0]) == 1, seen.shapes
    # one more leaf under the first root: that root branches, so the per-row masks stay
    obs = tree.node(leaves[0]).parent
    leaves.append(tree.finish(tree.append(obs, toks(3), [-0.3] * 3, True, 0), 0.0))
    part, allowed, rows, cols = asked(tree.export_packed(leaves))
    ids, pos = part["input_ids"], part["position_ids"]
    with torch.no_grad(), MaskShapes() as seen:
        got = compact_tree_logits_at(model, ids, pos, allowed, rows, cols, 4)
    assert per_row(seen.shapes, ids.shape[0]) == model.config.num_hidden_layers, seen.shapes
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos, attention_mask=part["attention_mask"]).logits[
            rows, cols
        ]
    close(got, want, "a branching root among linear ones")


def test_learner_packed_step_on_smollm2_layers_equals_its_flat_step() -> None:
    """Real SmolLM2-135M weights (its first 3 layers): the learner's packed chunk through the compact
    forward (the opening shared across roots once, each tree once) gives the flat chunk's policy
    log-probs and FlashREINFORCE gradients, and runs fewer tokens."""
    from fr_agents.models import load_policy
    from fr_agents.models.forward import FlatChunk, ForwardConfig, PackedChunk, PolicyForward
    from trainer.objective import flashreinforce_loss

    model, _ = load_policy("smollm2-135m")
    model.model.layers = model.model.layers[:3]
    model.config.num_hidden_layers = 3
    model = model.float()
    packed, flat = shared_opening_trees(model.config.vocab_size, seed=1)
    policy = PolicyForward(model, ForwardConfig(temperature=0.7))
    assert policy.compact_reason is None
    cpu = torch.device("cpu")

    def run(chunk):
        model.zero_grad(set_to_none=True)
        out = policy.logprobs(chunk, cpu)
        order = torch.argsort(out.rows)
        lp = out.log_probs[order]
        loss, _ = flashreinforce_loss(
            lp,
            flat.behavior_logprobs[:, : out.width],
            flat.rewards,
            flat.action_mask[:, : out.width],
            delta=10.0,
        )
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return lp, out.forward_tokens, grads

    lp_f, ran_f, g_f = run(FlatChunk(flat, torch.arange(flat.token_ids.shape[0])))
    lp_p, ran_p, g_p = run(PackedChunk(packed, list(range(len(packed.root_spans)))))
    act = flat.action_mask
    assert (lp_p - lp_f[:, : lp_p.shape[1]])[act].abs().max() <= 2e-4
    assert g_f.keys() == g_p.keys()
    for name in g_f:
        scale = float(g_f[name].abs().max())
        assert float((g_p[name] - g_f[name]).abs().max()) <= 2e-3 * scale + 1e-8, name
    assert ran_p < ran_f
