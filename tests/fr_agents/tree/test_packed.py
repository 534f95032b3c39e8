"""Tree-packed forward == flat forwards: per-leaf log-probs and FlashREINFORCE gradients.

A tiny Qwen2 (fp32, untied embeddings) samples a branching multi-turn tree: each episode forks
into several continuations after its first turn, with environment tokens between turns. The
behaviour log-probs are the model's own. Then one packed forward must reproduce the per-leaf
log-probs of the flat padded forward and of one forward per leaf, and the objective's loss and
gradients must match the flat form's.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fr_agents.tree import TrajectoryTree  # noqa: E402
from fr_agents.tree.batch import build_flat  # noqa: E402

VOCAB = 48


def tiny_qwen2(attn: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = attn
    return transformers.Qwen2ForCausalLM(cfg).float().eval()


@torch.no_grad()
def _sample(
    model: torch.nn.Module, prefix: list[int], n: int, gen: torch.Generator
) -> tuple[list[int], list[float]]:
    toks, lps = [], []
    for _ in range(n):
        logits = model(torch.tensor([prefix + toks])).logits[0, -1]
        logp = torch.log_softmax(logits, -1)
        t = int(torch.multinomial(logp.exp(), 1, generator=gen))
        toks.append(t)
        lps.append(float(logp[t]))
    return toks, lps


def build_tree(
    model: torch.nn.Module, roots: int = 2, forks: int = 3, seed: int = 0
) -> tuple[TrajectoryTree, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    tree = TrajectoryTree()
    leaves = []
    for r in range(roots):
        prompt = [1 + r, 5, 7, 9 + r]
        root = tree.add_root(prompt)
        toks, lps = _sample(model, prompt, 4, gen)
        turn1 = tree.append(root, toks, lps, True, 0)
        obs = tree.append(turn1, [2, 3, 4], None, False, 0)
        prefix = prompt + toks + [2, 3, 4]
        for k in range(forks):
            toks2, lps2 = _sample(model, prefix, 3 + k, gen)
            leaf = tree.append(obs, toks2, lps2, True, 0)
            leaves.append(tree.finish(leaf, float(torch.rand(1, generator=gen))))
    # one short episode that stops after its first turn (a leaf that is an inner node elsewhere)
    leaves.append(tree.finish(tree.node(leaves[0]).parent, 0.0))  # type: ignore[arg-type]
    return tree, leaves


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_logprobs_equal_flat_and_per_leaf(attn):
    torch.set_num_threads(1)
    model = tiny_qwen2(attn)
    tree, leaves = build_tree(model)
    flat = tree.export_flat(leaves)
    packed = tree.export_packed(leaves)
    assert packed.num_tokens < int(flat.lengths.sum())
    with torch.no_grad():
        lp_flat = flat.gather_logprobs(
            model(flat.token_ids, attention_mask=flat.attention_mask.long()).logits
        )
        out = model(
            packed.input_ids,
            attention_mask=packed.attention_mask(torch.float32),
            position_ids=packed.position_ids,
        )
        lp_packed = packed.gather_logprobs(out.logits)
        per_leaf = torch.zeros_like(lp_flat)
        for i, n in enumerate(flat.lengths.tolist()):
            logits = model(flat.token_ids[i : i + 1, :n]).logits
            per_leaf[i, 1:n] = torch.log_softmax(logits[0, :-1], -1).gather(-1, flat.token_ids[i, 1:n, None])[
                :, 0
            ]
    real = flat.attention_mask.clone()
    real[:, 0] = False
    assert (lp_packed - lp_flat)[real].abs().max() <= 1e-5
    assert (lp_packed - per_leaf)[real].abs().max() <= 1e-5
    # the stored behaviour log-probs were sampled from this very model
    act = flat.action_mask
    assert (lp_packed - flat.behavior_logprobs)[act].abs().max() <= 1e-5
    assert (lp_packed[~real] == 0).all()


def test_bool_mask_is_refused():
    tree = TrajectoryTree()
    leaf = tree.finish(tree.append(tree.add_root([1]), [2], [-0.1], True, 0), 1.0)
    with pytest.raises(ValueError, match="dtype"):
        tree.export_packed([leaf]).attention_mask(torch.bool)


def test_packed_mask_is_ancestor_causal():
    tree = TrajectoryTree()
    r = tree.add_root([1, 2])
    a = tree.finish(tree.append(r, [3, 4], [-0.1, -0.1], True, 0), 1.0)
    b = tree.finish(tree.append(r, [5], [-0.1], True, 0), 1.0)
    pb = tree.export_packed([a, b])
    assert pb.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    allowed = pb.allowed()
    assert allowed[4].tolist() == [True, True, False, False, True]  # b's token never sees a's branch
    assert allowed[3].tolist() == [True, True, True, True, False]
    m = pb.attention_mask(torch.float32)
    assert m.shape == (1, 1, 5, 5) and m[0, 0, 4, 2] == torch.finfo(torch.float32).min and m[0, 0, 4, 1] == 0
    assert pb.prev_index[0, 1:4].tolist() == [0, 1, 2] and pb.prev_index[1, 1:3].tolist() == [0, 1]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_flashreinforce_gradients_packed_equal_flat(attn):
    objective = pytest.importorskip("trainer.objective")
    torch.set_num_threads(1)
    model = tiny_qwen2(attn, seed=1)
    tree, leaves = build_tree(model, seed=1)
    with torch.no_grad():  # a policy step happened since sampling: ratios != 1, KL small
        for p in model.parameters():
            p.add_(0.002 * torch.randn_like(p))
    flat = tree.export_flat(leaves)
    packed = tree.export_packed(leaves)

    def grads(use_packed: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        if use_packed:
            out = model(
                packed.input_ids,
                attention_mask=packed.attention_mask(torch.float32),
                position_ids=packed.position_ids,
            )
            lp = packed.gather_logprobs(out.logits)
        else:
            lp = flat.gather_logprobs(model(flat.token_ids, attention_mask=flat.attention_mask.long()).logits)
        loss, stats = objective.flashreinforce_loss(
            lp, flat.behavior_logprobs, flat.rewards, flat.action_mask, delta=0.05
        )
        loss.backward()
        return float(loss.detach()), {
            n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
        }

    loss_f, g_f = grads(False)
    loss_p, g_p = grads(True)
    assert loss_p == pytest.approx(loss_f, abs=1e-6)
    assert g_f.keys() == g_p.keys() and len(g_f) > 10
    total = sum(float(g.abs().sum()) for g in g_f.values())
    assert total > 0, "the objective should produce a non-zero gradient"
    for name in g_f:
        assert torch.allclose(g_p[name], g_f[name], atol=1e-6, rtol=1e-4), name


def test_flat_batch_rows_are_each_trajectory_then_padding():
    """``build_flat``: row i holds trajectory i's tokens, behaviour log-probs, policy mask and
    versions, then padding (token 0, log-prob 0, not policy, not attended, version -1)."""
    tree, leaves = build_tree(tiny_qwen2("sdpa"))
    trajs = tree.trajectories(leaves)
    assert len({len(t.token_ids) for t in trajs}) > 1  # rows of different lengths
    flat = build_flat(trajs)
    width = max(len(t.token_ids) for t in trajs)
    assert flat.token_ids.shape == (len(trajs), width)
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        assert flat.token_ids[i, :n].tolist() == t.token_ids
        assert (
            flat.behavior_logprobs[i, :n].tolist() == torch.tensor(t.logprobs, dtype=torch.float32).tolist()
        )
        assert flat.action_mask[i, :n].tolist() == [bool(m) for m in t.policy_mask]
        assert flat.versions[i, :n].tolist() == t.versions
        assert flat.attention_mask[i].tolist() == [True] * n + [False] * (width - n)
        assert flat.token_ids[i, n:].eq(0).all() and flat.behavior_logprobs[i, n:].eq(0).all()
        assert not flat.action_mask[i, n:].any() and flat.versions[i, n:].eq(-1).all()
    assert flat.token_ids.dtype == flat.versions.dtype == torch.long
    assert flat.behavior_logprobs.dtype == torch.float32 and flat.action_mask.dtype == torch.bool
