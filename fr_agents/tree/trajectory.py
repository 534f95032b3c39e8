"""``Trajectory``: one root-to-leaf path of the tree, as the store reads it and the batches use it.

Its own module so that the store (which reads trajectories) and the batch builders (which pad and
pack them) both depend on it and not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# finished: the env ended it; truncated: cut by a budget or the env (it may carry a partial score);
# aborted: its grading could not happen (fr_agents.errors.InfrastructureFailure): stored as sampled,
# never trained on (docs/DESIGN.md, "Infrastructure failures")
STATUSES = ("finished", "truncated", "aborted")
REWARD_MODES = ("env", "partial")


@dataclass
class Trajectory:
    """One root-to-leaf path: per-token columns plus the leaf's outcome."""

    leaf_id: int
    root_id: int
    token_ids: list[int]
    logprobs: list[float]
    policy_mask: list[bool]
    versions: list[int]
    reward: float
    partial_score: float | None
    status: str
    info: dict[str, Any]
    prompt_len: int
    path: list[int] = field(default_factory=list)  # node ids, root first
    offsets: list[int] = field(default_factory=list)  # start of each path node on the path

    def learner_reward(self, mode: str = "env") -> float:
        """The reward the learner sees: the env reward, or (``"partial"``) the partial score of an
        unfinished (truncated/aborted) leaf when it has one."""
        if mode not in REWARD_MODES:
            raise ValueError(f"reward: must be one of {REWARD_MODES}, got {mode!r}")
        if mode == "partial" and self.status != "finished" and self.partial_score is not None:
            return float(self.partial_score)
        return float(self.reward)

    @property
    def failed(self) -> bool:
        """A failure: the episode did not finish normally, or its env reward is <= 0."""
        return self.status != "finished" or self.reward <= 0
