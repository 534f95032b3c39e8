"""What a rollout is given and what it gives back.

:class:`RolloutOptions` says how episodes are run (sampling, budgets, branching); it is frozen and
validated once, with the engines' own rules for the sampling fields. An episode returns an
:class:`EpisodeResult`: its root in the tree and one :class:`LeafResult` per finished
root-to-leaf path. ``EventFn`` and ``Actor`` are the two callables a caller may hand in: a
listener for the episode's events (prompt, action, observation, finish) and a scripted actor that
replies in the policy's place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fr_agents import defaults
from fr_agents.policy.base import SamplingOptions


@dataclass(frozen=True)
class RolloutOptions:
    """How episodes are run. ``branch_at`` lists turn boundaries (0 = before the first action)."""

    temperature: float = defaults.TEMPERATURE
    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    max_context: int = defaults.MAX_CONTEXT
    max_turns: int = defaults.MAX_TURNS
    system_prompt: str | None = None
    examples: tuple[
        tuple[str, str], ...
    ] = ()  # (role, content) turns between the system message and the first observation
    observation_role: str = "user"
    turn_reward: Literal["sum", "last"] = "sum"
    branch_factor: int = 1
    branch_at: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None  # None: derived from the tokenizer
    stop_strings: tuple[str, ...] = ()
    top_p: float = 1.0
    top_k: int = 0
    importance_correction: bool = True
    tree_budget_tokens: int = 0  # policy tokens per episode tree (0: no budget)
    branch_policy: Literal["fixed", "entropy", "token"] = "fixed"
    # entropy: fork when the last action's mean surprisal >= this; token: a fork point's entropy >= this
    branch_entropy: float = 0.0

    def __post_init__(self) -> None:
        if self.branch_policy not in ("fixed", "entropy", "token"):
            raise ValueError(
                f"branch_policy must be 'fixed', 'entropy' or 'token', got {self.branch_policy!r}"
            )
        if not float(self.branch_entropy) >= 0:
            raise ValueError(f"branch_entropy must be >= 0, got {self.branch_entropy}")
        if int(self.tree_budget_tokens) < 0:
            raise ValueError(f"tree_budget_tokens must be >= 0, got {self.tree_budget_tokens}")
        for name in ("max_new_tokens", "max_context", "max_turns", "branch_factor"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.turn_reward not in ("sum", "last"):
            raise ValueError(f"turn_reward must be 'sum' or 'last', got {self.turn_reward!r}")
        if any(int(t) < 0 for t in self.branch_at):
            raise ValueError(f"branch_at must hold turn indices >= 0, got {list(self.branch_at)}")
        if self.observation_role not in ("user", "tool"):
            raise ValueError(f"observation_role must be 'user' or 'tool', got {self.observation_role!r}")
        # Validate the sampling fields once, here, with the same rules as the engines.
        SamplingOptions(
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            top_p=self.top_p,
            top_k=self.top_k,
            importance_correction=self.importance_correction,
        )


@dataclass
class LeafResult:
    """One finished trajectory (one root-to-leaf path)."""

    leaf_id: int
    reward: float
    status: str
    partial_score: float | None
    turns: int
    policy_tokens: int
    rewards: list[float]
    info: dict[str, Any] = field(default_factory=dict)
    # policy tokens the engine sampled for this branch itself: its tokens since it forked (the
    # first branch also holds the shared part before the fork). Summed over an episode's leaves it
    # is what the engine sampled, identical siblings included (the tree stores those once).
    sampled_tokens: int = 0


@dataclass
class EpisodeResult:
    """An episode: its root and its leaves (one leaf, or more when it branched)."""

    root_id: int
    seed: int
    leaves: list[LeafResult]

    @property
    def reward(self) -> float:
        """Mean reward over the leaves."""
        return sum(leaf.reward for leaf in self.leaves) / len(self.leaves)

    @property
    def policy_tokens(self) -> int:
        """Policy tokens sampled for this episode (shared prefixes counted once per leaf path)."""
        return sum(leaf.policy_tokens for leaf in self.leaves)

    @property
    def sampled_tokens(self) -> int:
        """Policy tokens the engine sampled for this episode: each generated token once."""
        return sum(leaf.sampled_tokens for leaf in self.leaves)


EventFn = Callable[[str, dict[str, Any]], None]
"""A listener: called with each event's kind and payload as the episode runs."""
Actor = Callable[[Any], str]
"""A scripted actor: given the (wrapped) env, the text of its next reply."""
