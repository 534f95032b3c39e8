"""The FlashREINFORCE objective and the GRPO baseline: hand cases, edge cases and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainer.objective import binary_kl, flashreinforce_loss, group_normalized_advantages, grpo_loss

torch.set_num_threads(1)

F64 = torch.float64


def t64(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def leaf(rows: list[list[float]], dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype, requires_grad=True)


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# --------------------------------------------------------------------------- hand cases


def test_paper_gradient_formula_on_hand_case() -> None:
    # Row 0: two policy tokens (positions 1, 2), row 1: one policy token (position 2).
    lp = leaf([[0.0, math.log(0.5), math.log(0.25)], [0.0, 0.0, math.log(0.3)]])
    blp = t64([[0.0, math.log(0.4), math.log(0.25)], [0.0, 0.0, math.log(0.6)]])
    mask = torch.tensor([[False, True, True], [False, False, True]])
    rewards = t64([1.0, 0.0])  # A = [+0.5, -0.5]
    loss, stats = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf)
    g = grad_of(loss, lp)
    # d loss / d logp_it = -(1/B) (1/T_i) rho_it A_i
    expected = t64([[0.0, -(1 / 2) * (1 / 2) * 1.25 * 0.5, -(1 / 2) * (1 / 2) * 1.0 * 0.5], [0.0, 0.0, 0.0]])
    expected[1, 2] = -(1 / 2) * 1.0 * 0.5 * (-0.5)
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-14)
    value = (
        -((1.25 * 0.5 * math.log(0.5) + 1.0 * 0.5 * math.log(0.25)) / 2 + 0.5 * (-0.5) * math.log(0.3)) / 2
    )
    assert loss.item() == pytest.approx(value, rel=1e-12)
    torch.testing.assert_close(stats["advantages"], t64([0.5, -0.5]))
    assert stats["policy_tokens"].tolist() == [2, 1]
    assert stats["ratio_max"].item() == pytest.approx(1.25)
    assert stats["ratio_mean"].item() == pytest.approx((1.25 + 1.0 + 0.5) / 3)


def test_gate_drops_a_whole_row_and_keeps_denominator_b() -> None:
    lp = leaf([[0.0, -0.5, -0.7], [0.0, -0.3, -0.4]])
    blp = t64([[0.0, -0.5, -0.7], [0.0, -3.0, -0.4]])  # row 1 is far off-policy on one token
    mask = torch.tensor([[False, True, True], [False, True, True]])
    rewards = t64([2.0, 0.0])
    loss, stats = flashreinforce_loss(lp, blp, rewards, mask)
    assert stats["admitted"].tolist() == [True, False]
    assert stats["acceptance_rate"].item() == 0.5
    assert stats["sequence_kl"][1] > 3e-3 >= stats["sequence_kl"][0]
    g = grad_of(loss, lp)
    assert torch.all(g[1] == 0)
    # Row 0 keeps its own weight: -(1/B)(1/T_0) rho A with B=2 (not 1), T_0=2, rho=1, A=1.
    torch.testing.assert_close(g[0], t64([0.0, -0.25, -0.25]))


def test_nan_and_inf_in_masked_slots_are_harmless() -> None:
    mask = torch.tensor([[False, True, True, False], [False, False, True, False]])
    clean_lp = [[0.0, -0.4, -1.2, 0.0], [0.0, 0.0, -0.9, 0.0]]
    clean_blp = [[0.0, -0.41, -1.15, 0.0], [0.0, 0.0, -0.92, 0.0]]
    clean_ent = [[0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 3.0, 0.0]]
    dirty_lp = [[math.nan, -0.4, -1.2, math.inf], [-math.inf, math.nan, -0.9, 5.0]]
    dirty_blp = [[math.inf, -0.41, -1.15, math.nan], [math.nan, -math.inf, -0.92, 7.0]]
    dirty_ent = [[math.nan, 1.0, 2.0, math.inf], [-math.inf, math.nan, 3.0, math.nan]]
    rewards = t64([1.0, -1.0])
    failures = torch.tensor([True, True])
    results = []
    for lp_rows, blp_rows, ent_rows in ((clean_lp, clean_blp, clean_ent), (dirty_lp, dirty_blp, dirty_ent)):
        lp = leaf(lp_rows)
        loss, stats = flashreinforce_loss(
            lp,
            t64(blp_rows),
            rewards,
            mask,
            negative_token_fraction=0.5,
            entropies=t64(ent_rows),
            failures=failures,
        )
        g = grad_of(loss, lp)
        assert torch.isfinite(loss) and torch.isfinite(g).all()
        assert torch.all(g[~mask] == 0)
        assert torch.isfinite(stats["sequence_kl"]).all()
        results.append((loss.detach(), g, stats["sequence_kl"]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_entropy_filter_ceil_rule_and_stable_ties() -> None:
    # One failed row with T_i = 5 policy tokens, q = 0.5 -> ceil(2.5) = 3 kept.
    ent = t64([[9.0, 0.5, 2.0, 1.0, 2.0, 0.1, 7.0]])
    mask = torch.tensor([[False, True, True, True, True, True, False]])
    lp = leaf([[0.0, -1.0, -1.0, -1.0, -1.0, -1.0, 0.0]])
    blp = lp.detach().clone()
    rewards = t64([0.0])
    adv = t64([-1.0])  # a single row has zero centred advantage: pass one explicitly
    loss, stats = flashreinforce_loss(
        lp,
        blp,
        rewards,
        mask,
        negative_token_fraction=0.5,
        entropies=ent,
        failures=torch.tensor([True]),
        advantages=adv,
    )
    assert stats["retained_tokens"].tolist() == [3]
    kept = grad_of(loss, lp) != 0
    # Highest entropies among policy slots: 2.0 (pos 2), 2.0 (pos 4), 1.0 (pos 3). Masked 9.0/7.0 ignored.
    assert kept.tolist() == [[False, False, True, True, True, False, False]]
    # A tie at the cut is resolved by position (stable sort): q=0.2 -> ceil(1.0) = 1 -> position 2 only.
    loss, stats = flashreinforce_loss(
        lp,
        blp,
        rewards,
        mask,
        negative_token_fraction=0.2,
        entropies=ent,
        failures=torch.tensor([True]),
        advantages=adv,
    )
    assert stats["retained_tokens"].tolist() == [1]
    assert (grad_of(loss, lp) != 0).tolist() == [[False, False, True, False, False, False, False]]
    # q = 0 keeps nothing of a failed row; float noise never rounds a whole number up (0.7*10).
    _, stats = flashreinforce_loss(
        lp,
        blp,
        rewards,
        mask,
        negative_token_fraction=0.0,
        entropies=ent,
        failures=torch.tensor([True]),
    )
    assert stats["retained_tokens"].tolist() == [0]
    ten = torch.tensor([[False] + [True] * 10])
    _, stats = flashreinforce_loss(
        torch.full((1, 11), -1.0, dtype=F64),
        torch.full((1, 11), -1.0, dtype=F64),
        rewards,
        ten,
        negative_token_fraction=0.7,
        entropies=torch.rand(1, 11, dtype=F64),
        failures=torch.tensor([True]),
    )
    assert stats["retained_tokens"].tolist() == [7]


def test_filter_uses_explicit_failures_not_the_advantage_sign() -> None:
    # Row 0 succeeded by label but has a negative advantage; row 1 failed but has a positive one.
    mask = torch.tensor([[False, True, True, True, True]] * 2)
    lp = leaf([[0.0, -1.0, -1.1, -1.2, -1.3]] * 2)
    blp = lp.detach().clone()
    ent = t64([[0.0, 4.0, 3.0, 2.0, 1.0]] * 2)
    rewards = t64([0.0, 1.0])  # A = [-0.5, +0.5]
    failures = torch.tensor([False, True])
    loss, stats = flashreinforce_loss(
        lp, blp, rewards, mask, negative_token_fraction=0.5, entropies=ent, failures=failures
    )
    assert stats["advantages"].tolist() == [-0.5, 0.5]
    assert stats["retained_tokens"].tolist() == [4, 2]
    g = grad_of(loss, lp)
    assert (g[0, 1:] != 0).all()
    assert (g[1] != 0).tolist() == [False, True, True, False, False]
    # The denominator stays T_i = 4 for the filtered row.
    torch.testing.assert_close(g[1, 1], torch.tensor(-(1 / 2) * (1 / 4) * 0.5, dtype=F64))


def test_negative_min_prob_drops_only_unlikely_tokens_of_rows_pushed_down() -> None:
    # Row 0 (A = -0.5) and row 1 (A = +0.5) each hold one token sampled at p = 0.003 (position 2).
    mask = torch.tensor([[False, True, True, True]] * 2)
    lp = leaf([[0.0, math.log(0.9), math.log(0.003), math.log(0.5)]] * 2)
    blp = lp.detach().clone()
    rewards = t64([0.0, 1.0])
    paper, paper_stats = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf)
    loss, stats = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf, negative_min_prob=0.01)
    g, g_paper = grad_of(loss, lp), grad_of(paper, lp)
    # the unlikely token of the row pushed down gets no gradient; every other token keeps the paper's
    assert g[0, 2] == 0 and g_paper[0, 2] != 0
    keep = torch.ones_like(g, dtype=torch.bool)
    keep[0, 2] = False
    torch.testing.assert_close(g[keep], g_paper[keep])
    assert g[1, 2] == g_paper[1, 2] != 0  # a rewarded row's unlikely token still gets pushed up
    assert stats["retained_tokens"].tolist() == [2, 3] and paper_stats["retained_tokens"].tolist() == [3, 3]
    # the denominator stays T_i = 3
    torch.testing.assert_close(g[0, 1], torch.tensor((1 / 2) * (1 / 3) * 0.5, dtype=F64))
    # 0 is the paper's loss, exactly
    off, _ = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf, negative_min_prob=0.0)
    assert off.item() == paper.item()
    with pytest.raises(ValueError, match="negative_min_prob"):
        flashreinforce_loss(lp, blp, rewards, mask, negative_min_prob=1.5)


def test_negative_min_prob_suffix_scope_also_drops_the_rest_of_a_pushed_down_row() -> None:
    # Row 0 (A = -0.5): a copy that went wrong at position 2 (p = 0.003) and went on at p = 0.9 / 0.5;
    # row 1 (A = +0.5): the same tokens. Row 2 (A = -0.5) has no unlikely token.
    mask = torch.tensor([[False, True, True, True, True]] * 3)
    lp = leaf(
        [[0.0, math.log(0.9), math.log(0.003), math.log(0.9), math.log(0.5)]] * 2
        + [[0.0, math.log(0.9), math.log(0.8), math.log(0.9), math.log(0.5)]]
    )
    blp = lp.detach().clone()
    rewards = t64([0.0, 1.0, 0.0])  # batch mean 1/3
    paper, _ = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf)
    tok, tok_stats = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf, negative_min_prob=0.01)
    suf, suf_stats = flashreinforce_loss(
        lp, blp, rewards, mask, delta=math.inf, negative_min_prob=0.01, negative_min_prob_scope="suffix"
    )
    g, g_tok, g_paper = grad_of(suf, lp), grad_of(tok, lp), grad_of(paper, lp)
    # token scope: only the unlikely token loses its push; suffix: it and every later token of that row
    assert (g_tok[0] != 0).tolist() == [False, True, False, True, True]
    assert (g[0] != 0).tolist() == [False, True, False, False, False]
    torch.testing.assert_close(g[0, 1], g_paper[0, 1])  # before the deviation: the paper's push
    # rows with a positive advantage, and pushed-down rows without an unlikely token, are untouched
    torch.testing.assert_close(g[1:], g_paper[1:])
    assert suf_stats["retained_tokens"].tolist() == [1, 4, 4] and tok_stats["retained_tokens"].tolist() == [
        3,
        4,
        4,
    ]
    # the denominator stays T_i = 4
    torch.testing.assert_close(g[0, 1], torch.tensor(-(1 / 3) * (1 / 4) * (-1 / 3), dtype=F64))
    with pytest.raises(ValueError, match="negative_min_prob_scope"):
        flashreinforce_loss(lp, blp, rewards, mask, negative_min_prob=0.01, negative_min_prob_scope="row")


def test_zero_gradient_for_constant_rewards() -> None:
    lp = leaf([[0.0, -0.3, -2.0], [0.0, -0.7, -0.1]])
    blp = lp.detach() - 0.01
    mask = torch.tensor([[False, True, True], [False, True, True]])
    loss, stats = flashreinforce_loss(lp, blp, t64([3.0, 3.0]), mask, delta=math.inf)
    assert torch.all(grad_of(loss, lp) == 0)
    assert loss.item() == 0.0
    assert torch.all(stats["advantages"] == 0)


def test_zero_gradient_when_every_row_is_rejected() -> None:
    lp = leaf([[0.0, -0.3, -2.0], [0.0, -0.7, -0.1]])
    blp = lp.detach() - 0.5
    mask = torch.tensor([[False, True, True], [False, True, True]])
    loss, stats = flashreinforce_loss(lp, blp, t64([1.0, 0.0]), mask, delta=1e-4)
    assert stats["admitted"].tolist() == [False, False]
    assert stats["acceptance_rate"].item() == 0.0
    assert torch.all(grad_of(loss, lp) == 0)


def test_binary_kl_value_and_boundary_admission() -> None:
    d = binary_kl(torch.tensor([math.log(0.2)], dtype=F64), torch.tensor([math.log(0.4)], dtype=F64))
    assert d.item() == pytest.approx(0.0915162, abs=1e-7)
    assert d.item() == pytest.approx(0.2 * math.log(0.5) + 0.8 * math.log(0.8 / 0.6), rel=1e-12)
    lp = leaf([[0.0, math.log(0.4)]])
    blp = t64([[0.0, math.log(0.2)]])
    mask = torch.tensor([[False, True]])
    _, stats = flashreinforce_loss(lp, blp, t64([1.0]), mask, delta=math.inf)
    boundary = stats["sequence_kl"].item()
    assert boundary == pytest.approx(0.0915162, abs=1e-7)
    _, at = flashreinforce_loss(lp, blp, t64([1.0]), mask, delta=boundary)
    assert at["admitted"].tolist() == [True]
    _, below = flashreinforce_loss(lp, blp, t64([1.0]), mask, delta=math.nextafter(boundary, 0.0))
    assert below["admitted"].tolist() == [False]


def test_sequence_kl_is_clamped_at_zero_and_probabilities_clamped() -> None:
    # log-prob 0 (p = 1) is clamped to 1 - 1e-6, so identical certain tokens give KL exactly 0.
    lp = leaf([[0.0, 0.0]])
    _, stats = flashreinforce_loss(
        lp, t64([[0.0, 0.0]]), t64([1.0]), torch.tensor([[False, True]]), delta=0.0
    )
    assert stats["sequence_kl"].item() == 0.0 and stats["admitted"].item()


def test_sample_mean_gives_equal_mass_to_short_and_long_rows() -> None:
    t = 10
    mask = torch.zeros(2, t, dtype=torch.bool)
    mask[0, 1] = True  # length 1
    mask[1, 1:] = True  # length 9
    lp = leaf([[-0.5] * t, [-0.5] * t])
    blp = lp.detach().clone()
    rewards = t64([1.0, -1.0])  # |A| = 1 for both
    loss, _ = flashreinforce_loss(lp, blp, rewards, mask)
    g = grad_of(loss, lp)
    assert g[0].sum().item() == pytest.approx(-0.5, rel=1e-12)
    assert g[1].sum().item() == pytest.approx(+0.5, rel=1e-12)
    # Token-mean aggregation (ablation) weighs rows 1:9 instead.
    loss, _ = flashreinforce_loss(lp, blp, rewards, mask, aggregation="token_mean")
    g = grad_of(loss, lp)
    assert g[0].sum().item() == pytest.approx(-1 / 10, rel=1e-12)
    assert g[1].sum().item() == pytest.approx(9 / 10, rel=1e-12)


def test_no_importance_sampling_ablation_uses_ratio_one() -> None:
    lp = leaf([[0.0, math.log(0.5)], [0.0, math.log(0.5)]])
    blp = t64([[0.0, math.log(0.25)], [0.0, math.log(0.5)]])
    mask = torch.tensor([[False, True], [False, True]])
    rewards = t64([1.0, 0.0])
    on, _ = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf)
    off, _ = flashreinforce_loss(lp, blp, rewards, mask, delta=math.inf, importance_sampling=False)
    assert grad_of(on, lp)[0, 1].item() == pytest.approx(-0.5 * 2.0 * 0.5)
    assert grad_of(off, lp)[0, 1].item() == pytest.approx(-0.5 * 1.0 * 0.5)


def test_bf16_and_fp16_are_promoted_to_float32() -> None:
    base = [[0.0, -0.375, -1.25], [0.0, -0.5, -0.0625]]
    mask = torch.tensor([[False, True, True], [False, True, True]])
    blp32 = torch.tensor([[0.0, -0.5, -1.25], [0.0, -0.5, -0.125]])
    ref_lp = torch.tensor(base, requires_grad=True)
    ref, ref_stats = flashreinforce_loss(ref_lp, blp32, torch.tensor([1.0, 0.0]), mask, delta=math.inf)
    ref_g = grad_of(ref, ref_lp)
    for dtype in (torch.bfloat16, torch.float16):
        lp = torch.tensor(base, dtype=dtype, requires_grad=True)
        loss, stats = flashreinforce_loss(
            lp, blp32.to(dtype), torch.tensor([1.0, 0.0], dtype=dtype), mask, delta=math.inf
        )
        assert loss.dtype == torch.float32
        assert stats["sequence_kl"].dtype == torch.float32
        torch.testing.assert_close(loss, ref, rtol=0, atol=0)  # the values are exact in bf16/fp16
        g = grad_of(loss, lp)
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), ref_g, rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(stats["sequence_kl"], ref_stats["sequence_kl"])


def test_float64_stays_float64() -> None:
    lp = leaf([[0.0, -0.5]])
    loss, stats = flashreinforce_loss(lp, t64([[0.0, -0.5]]), t64([1.0]), torch.tensor([[False, True]]))
    assert loss.dtype == F64 and stats["sequence_kl"].dtype == F64


def test_admitted_ratio_overflow_raises_floating_point_error() -> None:
    lp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    blp = torch.tensor([[0.0, -100.0]])  # exp(100) overflows float32
    mask = torch.tensor([[False, True]])
    with pytest.raises(FloatingPointError):
        flashreinforce_loss(lp, blp, torch.tensor([1.0]), mask, delta=math.inf)
    # Rejected by the gate (KL ~ 13.8): no error, no gradient.
    loss, stats = flashreinforce_loss(lp, blp, torch.tensor([1.0]), mask)
    assert not stats["admitted"].item()
    assert torch.all(grad_of(loss, lp) == 0)


# --------------------------------------------------------------------------- invalid inputs


def _good() -> dict:
    return {
        "log_probs": torch.tensor([[0.0, -0.5, -0.2]], dtype=F64, requires_grad=True),
        "behavior_log_probs": t64([[0.0, -0.4, -0.3]]),
        "rewards": t64([1.0]),
        "action_mask": torch.tensor([[False, True, True]]),
    }


@pytest.mark.parametrize(
    "change, name",
    [
        ({"log_probs": torch.zeros(3, dtype=F64)}, "log_probs"),
        ({"log_probs": torch.zeros(1, 3, dtype=torch.long)}, "log_probs"),
        ({"behavior_log_probs": torch.zeros(1, 4, dtype=F64)}, "behavior_log_probs"),
        ({"behavior_log_probs": torch.zeros(1, 3, dtype=torch.long)}, "behavior_log_probs"),
        ({"rewards": t64([1.0, 2.0])}, "rewards"),
        ({"rewards": torch.tensor([1])}, "rewards"),
        ({"rewards": t64([math.nan])}, "rewards"),
        ({"rewards": t64([math.inf])}, "rewards"),
        ({"action_mask": torch.tensor([[0, 1, 1]])}, "action_mask"),
        ({"action_mask": torch.tensor([[False, False, False]])}, "action_mask"),
        ({"action_mask": torch.tensor([[False, True]])}, "action_mask"),
        ({"log_probs": t64([[0.0, math.nan, -0.2]])}, "log_probs"),
        ({"log_probs": t64([[0.0, -math.inf, -0.2]])}, "log_probs"),
        ({"log_probs": t64([[0.0, 0.1, -0.2]])}, "log_probs"),
        ({"behavior_log_probs": t64([[0.0, -0.4, math.inf]])}, "behavior_log_probs"),
        ({"behavior_log_probs": t64([[0.0, 0.4, -0.3]])}, "behavior_log_probs"),
        ({"delta": math.nan}, "delta"),
        ({"delta": -1e-3}, "delta"),
        ({"negative_token_fraction": 1.5}, "negative_token_fraction"),
        ({"negative_token_fraction": -0.1}, "negative_token_fraction"),
        ({"negative_token_fraction": 0.5}, "entropies"),
        ({"negative_token_fraction": 0.5, "entropies": torch.ones(1, 3, dtype=F64)}, "failures"),
        (
            {
                "negative_token_fraction": 0.5,
                "entropies": torch.ones(1, 2, dtype=F64),
                "failures": torch.tensor([True]),
            },
            "entropies",
        ),
        (
            {
                "negative_token_fraction": 0.5,
                "entropies": torch.ones(1, 3, dtype=F64),
                "failures": torch.tensor([1]),
            },
            "failures",
        ),
        ({"aggregation": "median"}, "aggregation"),
        ({"advantages": t64([math.nan])}, "advantages"),
        ({"num_rows": 0}, "num_rows"),
    ],
)
def test_invalid_inputs_raise_value_error_naming_the_argument(change: dict, name: str) -> None:
    kwargs = _good()
    kwargs.update(change)
    with pytest.raises(ValueError, match=name):
        flashreinforce_loss(**kwargs)


@pytest.mark.skipif(not hasattr(torch, "device"), reason="needs torch")
def test_device_mismatch_is_reported() -> None:
    kwargs = _good()
    kwargs["rewards"] = torch.tensor([1.0], dtype=F64, device="meta")
    with pytest.raises(ValueError, match="rewards"):
        flashreinforce_loss(**kwargs)


# --------------------------------------------------------------------------- GRPO


def test_grpo_group_normalisation() -> None:
    rewards = t64([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 2.0])
    groups = [7, 7, 7, 7, 3, 3, 9]
    adv = group_normalized_advantages(rewards, groups, eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64).std()  # unbiased sample std = 0.5
    torch.testing.assert_close(adv[:4], (t64([1.0, 0.0, 0.0, 0.0]) - 0.25) / std)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0]  # zero spread, and a singleton group
    # With the default eps the constant group divides by eps, not by zero.
    assert torch.isfinite(group_normalized_advantages(rewards, groups)).all()


def test_grpo_clipping_on_both_sides() -> None:
    # Four rows, one policy token each; two groups of two -> advantages +1/-1 scaled by 1/(std+eps).
    lp = leaf([[0.0, math.log(0.5)], [0.0, math.log(0.5)], [0.0, math.log(0.5)], [0.0, math.log(0.5)]])
    ratios = [1.5, 0.5, 0.5, 1.5]  # row: A>0 r>1+e (clipped) | A<0 r<1-e (clipped) | A>0 r<1-e | A<0 r>1+e
    blp = t64([[0.0, math.log(0.5 / r)] for r in ratios])
    rewards = t64([1.0, 0.0, 1.0, 0.0])
    groups = [0, 0, 1, 1]
    mask = torch.tensor([[False, True]] * 4)
    loss, stats = grpo_loss(lp, blp, rewards, mask, groups=groups, clip_eps=0.2, eps=0.0)
    a = stats["advantages"]
    s = math.sqrt(0.5)  # unbiased std of {1, 0}
    torch.testing.assert_close(a, t64([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s]))
    g = grad_of(loss, lp)
    # d/dlogp of r*A is r*A; token mean over 4 tokens; clipped rows get no gradient.
    expected = [0.0, 0.0, -(0.5 * a[2].item()) / 4, -(1.5 * a[3].item()) / 4]
    torch.testing.assert_close(g[:, 1], t64(expected))
    assert stats["clip_fraction"].item() == 0.5
    # loss value: -(1/4) * sum min(rA, clip(r)A)
    value = -(1.2 * a[0] + 0.8 * a[1] + 0.5 * a[2] + 1.5 * a[3]).item() / 4
    assert loss.item() == pytest.approx(value, rel=1e-12)


def test_grpo_groups_from_group_size_and_validation() -> None:
    kwargs = _good()
    kwargs["rewards"] = t64([1.0])
    with pytest.raises(ValueError, match="groups"):
        grpo_loss(**kwargs)
    lp = leaf([[0.0, -0.5]] * 4)
    mask = torch.tensor([[False, True]] * 4)
    a, _ = grpo_loss(lp, lp.detach(), t64([1.0, 0.0, 3.0, 1.0]), mask, group_size=2)
    b, _ = grpo_loss(lp, lp.detach(), t64([1.0, 0.0, 3.0, 1.0]), mask, groups=[0, 0, 1, 1])
    assert a.item() == b.item()
    with pytest.raises(ValueError, match="group_size"):
        grpo_loss(lp, lp.detach(), t64([1.0, 0.0, 3.0, 1.0]), mask, group_size=3)


# --------------------------------------------------------------------------- properties


@st.composite
def batches(draw: st.DrawFn) -> dict:
    b = draw(st.integers(1, 5))
    t = draw(st.integers(1, 6))
    mask = [[draw(st.booleans()) for _ in range(t)] for _ in range(b)]
    for row in mask:
        if not any(row):
            row[draw(st.integers(0, t - 1))] = True
    lp = [[draw(st.floats(-6.0, 0.0)) for _ in range(t)] for _ in range(b)]
    blp = [[min(0.0, x + draw(st.floats(-0.3, 0.3))) for x in row] for row in lp]
    ent = [[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])) for _ in range(t)] for _ in range(b)]
    return {
        "lp": lp,
        "blp": blp,
        "mask": mask,
        "rewards": [draw(st.floats(-10.0, 10.0)) for _ in range(b)],
        "ent": ent,
        "failures": [draw(st.booleans()) for _ in range(b)],
        "delta": draw(st.sampled_from([math.inf, 3e-3, 2e-2, 0.0])),
        "q": draw(st.sampled_from([1.0, 0.5, 0.25, 0.7, 0.0, 1 / 3])),
        "importance_sampling": draw(st.booleans()),
        "aggregation": draw(st.sampled_from(["sample_mean", "token_mean"])),
    }


def run_vectorised(case: dict, rewards: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    lp = leaf(case["lp"])
    loss, _ = flashreinforce_loss(
        lp,
        t64(case["blp"]),
        t64(rewards if rewards is not None else case["rewards"]),
        torch.tensor(case["mask"]),
        delta=case["delta"],
        negative_token_fraction=case["q"],
        entropies=t64(case["ent"]),
        failures=torch.tensor(case["failures"]),
        importance_sampling=case["importance_sampling"],
        aggregation=case["aggregation"],
    )
    return loss.detach(), grad_of(loss, lp)


def loop_reference(case: dict) -> tuple[float, list[list[float]], float]:
    """The objective written token by token in plain Python floats, with its analytic gradient.

    Also returns the smallest distance between any row's KL and delta, so that tests can skip cases
    sitting on the gate boundary (where two correct implementations may round differently).
    """
    lp, blp, mask, rewards = case["lp"], case["blp"], case["mask"], case["rewards"]
    b, t = len(lp), len(lp[0])
    mean = sum(rewards) / b
    total_tokens = sum(sum(row) for row in mask)
    loss = 0.0
    grad = [[0.0] * t for _ in range(b)]
    margin = math.inf
    for i in range(b):
        adv = rewards[i] - mean
        tokens = [j for j in range(t) if mask[i][j]]
        kl = 0.0
        for j in tokens:
            p = min(max(math.exp(blp[i][j]), 1e-6), 1 - 1e-6)
            q = min(max(math.exp(lp[i][j]), 1e-6), 1 - 1e-6)
            kl += p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
        kl = max(0.0, kl / len(tokens))
        if case["delta"] != math.inf:
            margin = min(margin, abs(kl - case["delta"]))
        if kl > case["delta"]:
            continue
        kept = tokens
        if case["q"] < 1.0 and case["failures"][i]:
            k = math.ceil(round(case["q"] * len(tokens), 9))
            kept = sorted(tokens, key=lambda j, i=i: -case["ent"][i][j])[:k]  # sorted() is stable
        for j in kept:
            rho = math.exp(lp[i][j] - blp[i][j]) if case["importance_sampling"] else 1.0
            scale = 1.0 / (b * len(tokens)) if case["aggregation"] == "sample_mean" else 1.0 / total_tokens
            loss -= scale * rho * adv * lp[i][j]
            grad[i][j] = -scale * rho * adv
    return loss, grad, margin


@settings(max_examples=150, deadline=None)
@given(batches())
def test_property_agrees_with_loop_form(case: dict) -> None:
    ref_loss, ref_grad, margin = loop_reference(case)
    assume(margin > 1e-9)
    loss, grad = run_vectorised(case)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-9, abs=1e-9)
    torch.testing.assert_close(grad, t64(ref_grad), rtol=1e-9, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(batches(), st.floats(-100.0, 100.0))
def test_property_invariant_to_reward_shift(case: dict, shift: float) -> None:
    loss, grad = run_vectorised(case)
    shifted_loss, shifted_grad = run_vectorised(case, [r + shift for r in case["rewards"]])
    assert shifted_loss.item() == pytest.approx(loss.item(), rel=1e-9, abs=1e-9)
    torch.testing.assert_close(shifted_grad, grad, rtol=1e-9, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(batches(), st.randoms(use_true_random=False))
def test_property_invariant_to_row_permutation(case: dict, rnd) -> None:
    b = len(case["lp"])
    perm = list(range(b))
    rnd.shuffle(perm)
    permuted = dict(case)
    for key in ("lp", "blp", "mask", "rewards", "ent", "failures"):
        permuted[key] = [case[key][p] for p in perm]
    loss, grad = run_vectorised(case)
    p_loss, p_grad = run_vectorised(permuted)
    assert p_loss.item() == pytest.approx(loss.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(p_grad, grad[perm], rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- credit up to progress


def test_progress_advantages_pay_each_row_before_its_credit_end_and_nothing_after() -> None:
    """``A_it = R_i - mean`` before ``credit_ends[i]``, ``0 - mean`` from there on (the tail of a
    cut row that made no progress is measured like a row that earned nothing), with merged rows'
    weights in the mean; any other baseline or algorithm refuses the cut, naming it."""
    from fr_agents.config import ConfigError, load_config
    from fr_agents.objective_config import ObjectiveConfig
    from trainer.objective import batch_advantages

    rewards = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    ends = torch.tensor([5, 2, 5])
    got = batch_advantages(ObjectiveConfig(), rewards, credit_ends=ends, width=5)
    mean = 0.5
    assert got.tolist() == [
        [0.5] * 5,
        [0.5 - mean] * 2 + [-mean] * 3,
        [-mean] * 5,
    ]
    weighted = batch_advantages(
        ObjectiveConfig(), rewards, credit_ends=ends, width=5, weights=torch.tensor([2.0, 1.0, 1.0])
    )
    assert weighted[1].tolist() == pytest.approx([0.5 - 0.625] * 2 + [-0.625] * 3)
    for cfg in (ObjectiveConfig(baseline="nodes"), ObjectiveConfig(algo="grpo")):
        with pytest.raises(ValueError, match="credit_ends"):
            batch_advantages(cfg, rewards, credit_ends=ends, width=5, root_ids=[0, 0, 1])
    load_config("math-tiny", ["rollout.reward=progress"])
    for bad in (["objective.baseline=nodes"], ["objective.algo=grpo", "objective.grpo_group_size=2"]):
        with pytest.raises(ConfigError, match="rollout.reward"):
            load_config("math-tiny", ["rollout.reward=progress", *bad])
