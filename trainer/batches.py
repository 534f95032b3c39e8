"""The batch path: which leaves form batch ``k``, and the tensors the learner gets for them.

One path, drawn in docs/DESIGN.md ("The batch path")::

    EpisodeSchedule.episodes(k)      which episodes form batch k (fixed by the seed, not by timing)
      -> EpisodeLedger.batch_rows(k) each finished episode's leaves, rewards, tokens, version
      -> keep_per_tree               identical siblings merged (one row weighted by their count),
                                     at most trainer.max_per_root per tree
      -> TrajectoryTree.trajectories the kept leaves' tokens, log-probs, versions, rewards
      -> build_flat / build_packed   flat [B, T] tensors, or tree-packed rows when leaves share
      -> Learner.step(batch)         one optimizer step
      -> ConsumedMarks.add(leaves)   marked consumed in the store, MARK_EVERY batches a
                                     transaction and all before a checkpoint stores the cursor

The schedule decides, the ledger records, the tree stores and exports: batch ``k`` holds exactly
the scheduled episodes, in episode order, whatever order they finished in. A branching episode
brings several leaves; pruning is a pure function of the ledger rows and the stored leaves, so a
resumed run prunes batch ``k`` exactly as before. Leaves whose grading could not happen (status
``aborted``, kept by the ledger apart) are never exported: the batch, its baseline and the
objective's denominators hold only what is trained on; an episode whose every attempt aborted
contributes nothing, and a batch of such episodes only has no rows (``batch`` None). The tree's own
``take_batch`` (next ``B`` unconsumed leaves, with pruning) is a store tool, not this path.

**Consumed marks** (:class:`ConsumedMarks`): trained batches marked consumed in the store, :data:`MARK_EVERY`
batches to a transaction. The marks serve a resume (which rewinds the store to its checkpoint's cursor, so a
mark not yet written costs nothing) and tools reading the store. One transaction per step would sit on the
learner's path: the rollout writes the store all the time, so each transaction re-reads its pages and waits
for the write lock in SQLite's busy sleeps.

**The schedule** (:class:`EpisodeSchedule`): deterministic, behind bounded-staleness training and exact
resume. Asynchronous training usually makes a batch depend on thread timing: which episodes finished first,
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fr_agents.config import TrainConfig
from fr_agents.ledger import LedgerRow
from fr_agents.seeding import stable_seed
from fr_agents.tree import TrajectoryTree
from fr_agents.tree.batch import TrainBatch, build_flat, build_packed, flat_view
from fr_agents.tree.store import keep_per_tree

if TYPE_CHECKING:
    from fr_agents.ledger import EpisodeLedger


@dataclass
class BatchTrees:
    """What pruning did to batch ``k`` (for metrics): episode trees, the leaves they grew, leaves
    merged as identical siblings and leaves cut by J_max (those are marked pruned in the store),
    and the sampled leaves the kept rows stand for (a row of merged identical siblings counts each)."""

    episodes: int = 0
    leaves_grown: int = 0
    merged: int = 0
    capped: int = 0
    partial_scored: int = 0  # kept rows whose learner reward is the env's partial score
    samples: int = 0  # sum of the kept rows' weights
    aborted: int = 0  # leaves of the batch's episodes whose grading could not happen (all attempts)
    aborted_episodes: int = 0  # scheduled episodes every attempt of which aborted: nothing to train on
    abort_reasons: dict[str, int] = field(
        default_factory=dict
    )  # InfrastructureFailure.reason -> aborted leaves

    @property
    def leaves_per_tree(self) -> float:
        return self.leaves_grown / max(1, self.episodes)


def export_batch(
    k: int, cfg: TrainConfig, schedule: EpisodeSchedule, ledger: EpisodeLedger, tree: TrajectoryTree
) -> tuple[TrainBatch | None, list[int], list[LedgerRow], BatchTrees]:
    """Batch ``k`` as the learner takes it: ``(batch, leaf ids, kept ledger rows, pruning)``.

    ``batch`` is None when no scheduled episode has a leaf to train on (every attempt of each
    aborted). Raises RuntimeError when the ledger's episodes are not the scheduled ones (each
    scheduled episode has trained leaves or only aborts). Each episode's
    leaves go through :func:`~fr_agents.tree.store.keep_per_tree` (``trainer.max_per_root``);
    the dropped ones are marked pruned in the store (they stay there), and a kept leaf that
    identical siblings were merged into gets their count as its row weight. The batch is a
    ``PackedBatch`` with ``trainer.packed=always``, or with ``auto`` when leaves share a prefix;
    else a ``FlatBatch``. ``rollout.reward`` picks the reward the learner sees.
    """
    rows = ledger.batch_rows(k)
    aborts = ledger.aborted_rows(k)
    expected = [s.episode for s in schedule.episodes(k)]
    got = list(dict.fromkeys(r.episode for r in rows))
    lost = sorted({a.episode for a in aborts} - set(got))  # every attempt aborted
    if got != [e for e in expected if e not in set(lost)] or not set(lost) <= set(expected):
        raise RuntimeError(f"batch {k}: the ledger holds episodes {got[:5]}…, expected {expected[:5]}…")
    reasons: dict[str, int] = {}
    for a in aborts:
        reasons[a.reason] = reasons.get(a.reason, 0) + 1
    if not rows:
        return (
            None,
            [],
            [],
            BatchTrees(aborted=len(aborts), aborted_episodes=len(lost), abort_reasons=reasons),
        )
    reward_mode = cfg.rollout.reward
    by_leaf = {t.leaf_id: t for t in tree.trajectories(sorted({r.leaf for r in rows}))}
    per_episode: dict[int, list[LedgerRow]] = {}
    for r in rows:
        per_episode.setdefault(r.episode, []).append(r)
    trees = [
        [(r.leaf, by_leaf[r.leaf].learner_reward(reward_mode)) for r in eps] for eps in per_episode.values()
    ]
    kept_ids, counts, merged, capped = keep_per_tree(trees, cfg.trainer.max_per_root)
    kept_rows: list[LedgerRow] = []
    weights: list[float] = []
    for eps, keep, count in zip(per_episode.values(), kept_ids, counts, strict=True):
        first = {}
        for r in eps:
            first.setdefault(r.leaf, r)
        kept_rows.extend(first[leaf] for leaf in keep)
        weights.extend(float(c) for c in count)
    leaves = [r.leaf for r in kept_rows]
    dropped = sorted({r.leaf for r in rows} - set(leaves))
    if dropped:
        tree.mark_pruned(dropped)
    trajs = [by_leaf[leaf] for leaf in leaves]
    partial = sum(1 for t in trajs if reward_mode != "env" and t.cut_with_score)
    info = BatchTrees(
        len(per_episode),
        len(rows),
        merged,
        capped,
        partial,
        int(sum(weights)),
        len(aborts),
        len(lost),
        reasons,
    )
    shared = len(set(by_leaf[leaf].root_id for leaf in leaves)) < len(leaves)
    packed_mode = cfg.trainer.packed
    if packed_mode == "always" or (packed_mode == "auto" and shared):
        return build_packed(trajs, reward_mode, weights), leaves, kept_rows, info
    return build_flat(trajs, reward_mode, weights), leaves, kept_rows, info


def save_bad_batch(run_dir: Path, k: int, batch: TrainBatch, leaves: list[int], err: Exception) -> Path:
    """Keep a batch that gave a non-finite loss as ``RUN_DIR/nan_batch_step<k>.pt`` (for a post-mortem)."""
    path = Path(run_dir) / f"nan_batch_step{k}.pt"
    flat = flat_view(batch)
    torch.save(
        {
            "step": k,
            "error": str(err),
            "leaf_ids": leaves,
            "token_ids": flat.token_ids,
            "behavior_logprobs": flat.behavior_logprobs,
            "action_mask": flat.action_mask,
            "rewards": flat.rewards,
            "weights": flat.weights,
            "versions": flat.versions,
            "stats": getattr(err, "stats", {}),
        },
        path,
    )
    return path


# =========================================================================== consumed

MARK_EVERY = 25  # trained batches marked consumed in the store per transaction


class ConsumedMarks:
    """The consumed marks of trained batches, held until :data:`MARK_EVERY` of them (or
    :meth:`settle`: before a checkpoint stores the cursor, at the run's end) are written at once."""

    def __init__(self, tree: TrajectoryTree) -> None:
        self.tree = tree
        self._held: list[list[int]] = []

    def add(self, leaves: list[int]) -> None:
        """Mark the leaves of one trained batch consumed."""
        self._held.append(leaves)
        if len(self._held) >= MARK_EVERY:
            self.settle()

    def settle(self) -> None:
        """Write the marks held."""
        if self._held:
            batches, self._held = self._held, []
            self.tree.mark_consumed_batches(batches, durable=False)


# =========================================================================== schedule


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
