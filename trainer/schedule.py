"""The deterministic episode schedule behind bounded-staleness training and exact resume.

Asynchronous training usually makes a batch depend on thread timing: which episodes finished first,
which weights a rollout happened to see. Here nothing depends on timing:

* Batch ``k`` is a fixed list of episodes. With FlashREINFORCE it is ``B`` prompts, one sample
  each; with GRPO it is ``B / G`` prompts, ``G`` samples each. Episode ``i`` (a global counter) gets
  its prompt from a seeded permutation of the train split, epoch by epoch, and its sampling seed
  from ``(run seed, i)``.
* With branching (``rollout.branch_factor`` K at the turns ``branch_at``) every episode is a tree
  of up to ``L = K ** len(branch_at)`` leaves, and ``batch_size`` counts leaves: batch ``k`` holds
  ``B / (G * L)`` prompts. The leaves an episode actually grows depend only on its seed and
  weights, so the batch is still fixed by the schedule.
* Batch ``k`` is sampled with policy version ``max(0, k - max_policy_lag)`` and trained on at
  learner version ``k``, so every token's lag is at most ``max_policy_lag``. This *is* the admission
  rule "a new episode waits while the oldest unconsumed trajectory would exceed the lag": the
  episodes of batch ``k`` may start only once version ``k - max_policy_lag`` exists, and rollout runs
  up to ``max_policy_lag`` batches ahead of the learner, concurrently with it.

Re-running an episode with the same weights and seed reproduces the same tokens, so an interrupted
run resumes to exactly the batches and parameters an uninterrupted run would have had.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fr_agents.seeding import stable_seed


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED): the one
    hash of :func:`fr_agents.seeding.stable_seed`, ``/``-joined, as the schedule has always drawn."""
    return stable_seed(*parts, sep="/", bits=63)


@dataclass(frozen=True)
class EpisodeSpec:
    """One scheduled episode."""

    episode: int  # global episode index
    batch: int  # the learner step that trains on it
    slot: int  # global prompt slot (GRPO: G episodes share a slot)
    member: int  # index inside its GRPO group (0 for FlashREINFORCE)
    task_index: int  # index into the train split
    seed: int  # sampling seed
    version: int  # policy version that samples it

    @property
    def key(self) -> str:
        return f"e{self.episode}"


class EpisodeSchedule:
    """Maps batch ``k`` to its episodes. Pure and cheap; the same arguments give the same schedule."""

    def __init__(
        self,
        *,
        num_tasks: int,
        batch_size: int,
        group_size: int = 1,
        leaves_per_episode: int = 1,
        max_policy_lag: int = 0,
        seed: int = 0,
        task_seed: int = 0,
    ) -> None:
        if num_tasks < 1:
            raise ValueError("tasks: the train split is empty")
        if group_size < 1 or batch_size % group_size:
            raise ValueError(
                f"trainer.batch_size: {batch_size} must be a multiple of the group size {group_size}"
            )
        if leaves_per_episode < 1 or batch_size % (group_size * leaves_per_episode):
            raise ValueError(
                f"trainer.batch_size: {batch_size} must be a multiple of group size x leaves per episode "
                f"({group_size} x {leaves_per_episode})"
            )
        self.num_tasks = num_tasks
        self.batch_size = batch_size
        self.group_size = group_size
        self.leaves_per_episode = leaves_per_episode
        self.prompts_per_batch = batch_size // (group_size * leaves_per_episode)
        self.max_policy_lag = max_policy_lag
        self.seed = seed
        self.task_seed = task_seed
        self._perm_cache: dict[int, np.ndarray] = {}

    def sampling_version(self, batch: int) -> int:
        """The policy version that samples batch ``batch``."""
        return max(0, batch - self.max_policy_lag)

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            rng = np.random.default_rng(derive_seed("tasks", self.task_seed, epoch))
            self._perm_cache = {epoch: rng.permutation(self.num_tasks)}
        return self._perm_cache[epoch]

    def task_index(self, slot: int) -> int:
        epoch, pos = divmod(slot, self.num_tasks)
        return int(self._perm(epoch)[pos])

    def episodes(self, batch: int) -> list[EpisodeSpec]:
        out = []
        version = self.sampling_version(batch)
        for j in range(self.prompts_per_batch):
            slot = batch * self.prompts_per_batch + j
            task = self.task_index(slot)
            for g in range(self.group_size):
                episode = slot * self.group_size + g
                out.append(
                    EpisodeSpec(
                        episode=episode,
                        batch=batch,
                        slot=slot,
                        member=g,
                        task_index=task,
                        seed=derive_seed("episode", self.seed, episode),
                        version=version,
                    )
                )
        return out
