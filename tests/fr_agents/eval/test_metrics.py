"""The unbiased pass@k estimator against its combinatorial definition, and mean@k."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fr_agents.eval.metrics import mean_at_k, mean_pass_at_k, pass_at_k
from fr_agents.eval.runner import report_ks, summarize_rows


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of all k-subsets of n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_combinatorial_definition_for_every_small_case(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


@given(st.integers(1, 200), st.data())
def test_pass_at_k_equals_one_minus_the_binomial_ratio(n: int, data: st.DataObject) -> None:
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-9)
    assert 0.0 <= pass_at_k(n, c, k) <= 1.0


def test_pass_at_1_is_the_success_rate_and_pass_at_k_grows_with_k() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    values = [pass_at_k(10, 3, k) for k in range(1, 11)]
    assert values == sorted(values)
    assert values[-1] == 1.0  # 8+ draws out of 10 with 3 correct always hit one
    assert pass_at_k(10, 0, 10) == 0.0


@pytest.mark.parametrize(
    ("n", "c", "k", "field"),
    [(0, 0, 1, "n"), (3, 4, 1, "c"), (3, -1, 1, "c"), (3, 1, 4, "k"), (3, 1, 0, "k")],
)
def test_pass_at_k_rejects_impossible_arguments_naming_the_field(n: int, c: int, k: int, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} "):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_and_mean_at_k() -> None:
    assert mean_pass_at_k([0, 2, 4], n=4, k=1) == pytest.approx((0 + 0.5 + 1) / 3)
    assert mean_at_k([[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]]) == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    with pytest.raises(ValueError, match="empty"):
        mean_pass_at_k([], n=4, k=1)
    with pytest.raises(ValueError, match=r"rewards_per_problem\[1\]"):
        mean_at_k([[1.0], []])


def test_summarize_rows_uses_the_first_k_samples_of_each_task() -> None:
    rows = {
        "a": [
            {"reward": 1.0, "success": True},
            {"reward": 0.0, "success": False},
            {"reward": 1.0, "success": True},
        ],
        "b": [
            {"reward": 0.0, "success": False},
            {"reward": 0.0, "success": False},
            {"reward": 1.0, "success": True},
        ],
    }
    m = summarize_rows(rows, k=2)
    assert m["mean@k"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@2"] == pytest.approx((1.0 + 0.0) / 2)
    assert set(m) == {"mean@k", "success", "pass@1", "pass@2"}
    with pytest.raises(ValueError, match="fewer than k=4"):
        summarize_rows(rows, k=4)


def test_report_ks_are_one_powers_of_two_and_k() -> None:
    assert report_ks(1) == [1]
    assert report_ks(8) == [1, 2, 4, 8]
    assert report_ks(10) == [1, 2, 4, 8, 10]
