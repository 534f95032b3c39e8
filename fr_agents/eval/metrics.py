"""Benchmark metrics: the unbiased pass@k estimator and mean@k.

For one problem with ``n`` samples of which ``c`` are correct, the probability that at least one
of ``k`` samples drawn without replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

computed here as a numerically stable product, ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.
``mean@k`` (also written avg@k) is the mean reward over the ``k`` samples of a problem.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must lie in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over problems that each have ``n`` samples."""
    if not correct_counts:
        raise ValueError("correct_counts is empty")
    return sum(pass_at_k(n, c, k) for c in correct_counts) / len(correct_counts)


def mean_at_k(rewards_per_problem: Sequence[Sequence[float]]) -> float:
    """mean@k: the mean over problems of the mean reward of that problem's samples."""
    if not rewards_per_problem:
        raise ValueError("rewards_per_problem is empty")
    for i, rs in enumerate(rewards_per_problem):
        if not rs:
            raise ValueError(f"rewards_per_problem[{i}] has no samples")
    return sum(sum(rs) / len(rs) for rs in rewards_per_problem) / len(rewards_per_problem)
