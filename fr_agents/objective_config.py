"""The objective's config: its switches, their choices and their value rules, torch-free.

One home for each switch of the policy-gradient objective. :class:`ObjectiveConfig` is the
``objective`` section of the run's config (:mod:`fr_agents.config` imports it) and the object the
loss takes (:func:`trainer.objective.objective_loss`), as prime-rl's loss takes its loss config: a
switch is declared once, with its help line and its rule, and read where it acts.

The ``rule_*`` functions check one value and say what is wrong without naming it;
:mod:`fr_agents.config` prefixes the dotted key (``objective.delta: ...``) and the ``validate_*``
functions the argument's name (``delta: ...``), so a bad value is refused in the same words
wherever it enters. :func:`option` declares a config field with its help line; every section of
:mod:`fr_agents.config` uses it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

AGGREGATIONS = ("sample_mean", "token_mean")
ALGOS = ("flashreinforce", "grpo")
#: the flashreinforce advantage: against the batch mean, or also against the leaf's branching node
BASELINES = ("batch", "tree", "nodes")
#: where objective.negative_min_prob cuts a row pushed down: its unlikely tokens, or from the first one on
MIN_PROB_SCOPES = ("token", "suffix")


# --------------------------------------------------------------------------- rules (one home each)


def rule_delta(value: Any) -> None:
    """The sequence trust region's radius: a number >= 0 (``inf`` disables the gate)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"must be >= 0 (inf disables the trust region), got {value}")


def rule_fraction(value: Any) -> None:
    """A share in [0, 1]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"must lie in [0, 1], got {value!r}")


def rule_aggregation(value: Any) -> None:
    """How token losses are averaged."""
    if value not in AGGREGATIONS:
        raise ValueError(f"expected one of {', '.join(AGGREGATIONS)}, got {value!r}")


def positive(value: Any) -> None:
    """A number > 0."""
    if not value > 0:
        raise ValueError(f"must be > 0, got {value}")


def at_least(n: int) -> Callable[[Any], None]:
    """The rule ``value >= n``."""

    def rule(value: Any) -> None:
        if value < n:
            raise ValueError(f"must be >= {n}, got {value}")

    return rule


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: tuple[Any, ...] = (),
    rule: Any = None,
    factory: Any = dataclasses.MISSING,
) -> Any:
    """A config field with its one line of ``help`` (and optional ``choices`` / value ``rule``)."""
    meta = {"help": help, "choices": choices, "rule": rule}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- named checks


def _named(name: str, rule: Callable[[Any], None], value: Any) -> None:
    """Apply a rule to an argument, naming the argument in the message."""
    try:
        rule(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _choice(name: str, choices: tuple[str, ...], value: Any) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


def validate_delta(value: float) -> None:
    _named("delta", rule_delta, value)


def validate_fraction(value: float) -> None:
    _named("negative_token_fraction", rule_fraction, value)


def validate_min_prob(value: float) -> None:
    _named("negative_min_prob", rule_fraction, value)


def validate_min_prob_scope(value: str) -> None:
    _choice("negative_min_prob_scope", MIN_PROB_SCOPES, value)


def validate_aggregation(value: str) -> None:
    _named("aggregation", rule_aggregation, value)


# --------------------------------------------------------------------------- the config


@dataclass
class ObjectiveConfig:
    """The policy-gradient objective and its ablation switches."""

    algo: str = option(
        "flashreinforce",
        help="flashreinforce (batch-mean baseline, one rollout per prompt) or grpo",
        choices=ALGOS,
    )
    delta: float = option(
        3e-3,
        help=(
            "sequence trust region: rows whose mean per-token binary KL (behaviour vs "
            "current probability of the sampled token) exceeds it are dropped (inf: off)"
        ),
        rule=rule_delta,
    )
    importance_sampling: bool = option(True, help="weight tokens by the policy / behaviour probability ratio")
    aggregation: str = option(
        "sample_mean",
        help="loss average: sample_mean (per row, then rows) or token_mean",
        rule=rule_aggregation,
    )
    negative_token_fraction: float = option(
        1.0,
        help="share of a failed row's tokens (highest entropy first) that keep a gradient; a row is "
        "failed when it did not finish or its env reward is <= 0, whatever its advantage, so at 0 "
        "only won rows train (a cut row paid above the batch mean by its partial score too gets none)",
        rule=rule_fraction,
    )
    negative_min_prob: float = option(
        0.0,
        help="in rows with a negative advantage, tokens sampled with a probability below "
        "this get no gradient (pushing an already unlikely token further down can give one "
        "token a gradient thousands of times the rest); 0: off, the paper's loss",
        rule=rule_fraction,
    )
    negative_min_prob_scope: str = option(
        "token",
        help="where objective.negative_min_prob cuts a row pushed down: token "
        "(only its unlikely tokens) or suffix (from its first unlikely token to the row's "
        "end: the tokens after an unlikely deviation are its consequences; see "
        "trainer/objective.py)",
        choices=MIN_PROB_SCOPES,
    )
    baseline: str = option(
        "batch",
        help="flashreinforce advantage: batch (R - batch mean), tree (also against the mean "
        "of the leaves sharing the leaf's branching node, TreeRL-style) or nodes (per token: the value "
        "of the tree node it lies in, the mean reward of the leaves under it, minus that of the fork "
        "above, or the batch mean above the first fork; see trainer/objective.py)",
        choices=BASELINES,
    )
    grpo_group_size: int = option(4, help="samples per prompt when objective.algo=grpo", rule=at_least(1))
    grpo_clip: float = option(0.2, help="PPO-style ratio clip of objective.algo=grpo", rule=positive)

    def check(self) -> None:
        """Refuse a bad switch by its name (``delta: must be >= 0 ...``), as the loss does."""
        _choice("algo", ALGOS, self.algo)
        _choice("baseline", BASELINES, self.baseline)
        validate_delta(self.delta)
        validate_fraction(self.negative_token_fraction)
        validate_min_prob(self.negative_min_prob)
        validate_min_prob_scope(self.negative_min_prob_scope)
        validate_aggregation(self.aggregation)

    @property
    def needs_entropies(self) -> bool:
        """Whether the loss needs per-token entropies (FlashREINFORCE's negative-token filter is on)."""
        return self.algo == "flashreinforce" and self.negative_token_fraction < 1.0
