"""The one async interface every inference engine implements.

Token ids go in; token ids come out together with the log-prob of each sampled token under the
distribution it was actually sampled from (after temperature), and the policy version that
sampled it. Engines never see text: chat templating and tokenisation happen in the rollout.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class SamplingOptions:
    """Per-request sampling options.

    ``importance_correction`` is on by default: then ``top_p < 1`` or ``top_k > 0`` raise,
    because the stored behaviour log-probs must describe the full tempered distribution.
    """

    temperature: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    top_p: float = 1.0
    top_k: int = 0
    importance_correction: bool = True
    seed: int | None = None
    entropies: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.importance_correction and (self.top_p < 1 or self.top_k > 0):
            raise ValueError(
                "top_p/top_k truncation is not allowed while importance_correction is on: the "
                "behaviour log-probs would not describe the distribution the trainer corrects for"
            )


@dataclass
class Generation:
    """One completion: exactly the sampled ids, their log-probs and the sampling policy version.

    ``versions`` holds the policy version that sampled each token (an engine may swap weights
    between two decode steps of one generation); ``version`` is the oldest of them, the
    conservative value for staleness accounting. Engines that never swap mid-generation may leave
    ``versions`` empty, meaning "every token has ``version``". ``entropies`` holds the entropy (nats)
    of the distribution each token was drawn from when the request asked for them, else is empty.
    """

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: Literal["stop", "length"] = "length"
    extra: dict[str, Any] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)

    def token_versions(self) -> list[int]:
        """The version of every token (``versions`` or ``version`` repeated)."""
        return list(self.versions) if self.versions else [self.version] * len(self.token_ids)


class Engine(abc.ABC):
    """Async token-in/token-out generation with versioned weights."""

    version: int = 0

    @abc.abstractmethod
    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions) -> Generation:
        """Sample a continuation of ``prompt_ids``."""

    @abc.abstractmethod
    def set_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load new policy weights and bump :attr:`version` to ``version``."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, servers)."""
