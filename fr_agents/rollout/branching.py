"""Where and how an episode forks: the branches of one episode's tree.

Branching. At each turn boundary named in ``branch_at`` (0 = before the first action) the episode
forks into ``branch_factor`` continuations sharing the prefix in the tree. The env is forked with
its ``fork()`` method when it has one; otherwise a fresh env is made, reset with the same seed and
task, and the action prefix is replayed, checking that every observation matches. A continuation
is a copy of its branch's state (:meth:`_Branch.fork`) with its own env and engine view.

Adaptive branching. With ``branch_policy="entropy"`` the turns of ``branch_at`` are candidates: a
path forks there only when its last action was uncertain, i.e. the mean surprisal of its sampled
tokens (minus the mean behaviour log-prob, an estimate of the policy's entropy there) is at least
``branch_entropy`` (turn 0 has no last action and always forks). Confident turns are not re-sampled,
uncertain ones get ``branch_factor`` continuations; a path's decision depends only on its own tokens
(deterministic for exact resume), and a tree still has at most ``branch_factor ** len(branch_at)``
leaves.

In-turn branching. With ``branch_policy="token"`` a path forks *inside* its reply at each turn of
``branch_at``, where the policy was uncertain: it samples the reply once, with the entropy of every
token's distribution (the hf engine reports them), and each of ``branch_factor - 1``
continuations keeps that reply up to one of its highest-entropy tokens (those below
``branch_entropy`` are never fork points) and samples that token and the rest afresh. The
continuations store the shared head once more under the same node; the store shares it (a fork
point becomes a node boundary), so a tree holds the prompt and each shared head once. The
continuations' envs are forked before the first reply is acted on; each path then goes on like
any other (and forks again at a later turn of ``branch_at``). A tree has at most
``branch_factor ** len(branch_at)`` leaves, as with the other policies.

Tree token budget. ``tree_budget_tokens`` (0: none) bounds the policy tokens one episode tree
samples: the root branch holds the whole budget, and at each fork the remaining budget is split
equally among the continuations (so the total never exceeds it, and which branch is cut does not
depend on how the branches interleave). A branch whose share is spent ends ``truncated`` at its next
turn boundary (``truncated_by: tree_budget``), scored like any cut branch.

:class:`Branching` is the forking half of the episode's state machine
(:class:`fr_agents.rollout.episode._Episode` derives from it): it decides where a branch forks,
forks its env and its engine's seed stream, and runs the continuations through the episode's own
``run``, ``act``, ``store_generation`` and ``finish``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fr_agents.errors import InfrastructureFailure
from fr_agents.policy.base import Generation, SamplingOptions
from fr_agents.rollout.env_thread import env_name, in_env_thread
from fr_agents.rollout.options import LeafResult

log = logging.getLogger(__name__)


class ForkMismatchError(RuntimeError):
    """Replaying the action prefix on a fresh env did not reproduce the recorded observations."""


@dataclass
class _Branch:
    """The state of one (possibly forked) conversation."""

    env: Any
    messages: list[dict[str, str]]
    held_ids: list[int]
    held_text: str
    node: int
    turn: int = 0
    rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    policy_tokens: int = 0  # policy tokens on this branch's path (a fork's shared part included)
    sampled: int = 0  # policy tokens this branch sampled itself (since it forked)
    branched: set[int] = field(default_factory=set)
    turn_starts: list[int] = field(default_factory=list)  # held_text offset where each turn's action begins
    demo_spans: list[tuple[int, int]] = field(
        default_factory=list
    )  # token spans of scripted (non-policy) replies
    engine: Any = None  # this branch's engine view (None: the episode's engine)
    budget: float = float("inf")  # this branch's share of the tree's policy-token budget
    surprisal: float = 0.0  # mean -log p of the last sampled action (0 for scripted replies)
    # the env's progress as its steps report it (info["partial_score"]): partial_best is the best score
    # so far; progress_turn how many replies had been made when it was first reached (0: no score above
    # 0 yet; None: no step reported a score). A score that falls and comes back (take, put back, take
    # again) is no new progress.
    partial_best: float = 0.0
    progress_turn: int | None = None

    def fork(self, env: Any) -> _Branch:
        """A continuation of this branch with ``env``: the same state, with its own copy of every
        list, dict and set (so the two grow apart), and nothing sampled yet (the shared part was
        sampled once, by this branch)."""
        own = {
            f.name: copy.copy(v)
            for f in fields(self)
            if isinstance(v := getattr(self, f.name), list | dict | set)
        }
        return replace(self, **{**own, "env": env, "sampled": 0})


def fork_positions(entropies: list[float], n: int, floor: float) -> list[int]:
    """Where an in-turn fork resamples a reply: the positions of its ``n`` highest-entropy tokens
    whose entropy is at least ``floor`` (ties: the earlier token first), in reply order. A
    continuation keeps the reply before the position and samples that token afresh."""
    ranked = sorted(range(len(entropies)), key=lambda i: (-entropies[i], i))
    return sorted(i for i in ranked[:n] if entropies[i] >= floor)


class Branching:
    """The forking half of an episode (see the module docstring); the episode supplies ``opt``,
    ``engine``, ``make_env``, ``seed``, ``reset_options``, ``emit`` and the turn methods."""

    def should_branch(self, b: _Branch) -> bool:
        """Whether ``b`` forks now, before its reply: at a turn of ``branch_at`` it has not forked
        at, and (entropy policy) only when its last action's mean surprisal reaches
        ``branch_entropy``. The token policy forks inside the reply instead (:meth:`forks_in_turn`)."""
        if self.opt.branch_factor < 2 or b.turn not in self.opt.branch_at or b.turn in b.branched:
            return False
        if self.opt.branch_policy == "token":
            return False
        if self.opt.branch_policy == "entropy" and b.turn > 0 and b.surprisal < self.opt.branch_entropy:
            b.branched.add(b.turn)  # decided: this path goes on alone
            return False
        return True

    def forks_in_turn(self, b: _Branch) -> bool:
        """Whether ``b``'s next reply is sampled once and then forked at its uncertain tokens (token
        policy, a turn of ``branch_at`` it has not forked at)."""
        return (
            self.opt.branch_policy == "token"
            and self.opt.branch_factor >= 2
            and b.turn in self.opt.branch_at
            and b.turn not in b.branched
        )

    async def branch_in_turn(self, b: _Branch, opts: SamplingOptions) -> list[LeafResult]:
        """Fork ``b`` inside its reply (token policy, module docstring "In-turn branching").

        ``b`` samples its reply with per-token entropies; each of up to ``branch_factor - 1``
        continuations keeps that reply up to one fork point (:func:`fork_positions`) and samples
        the rest afresh from there, with its own env (forked before the reply is acted on) and its
        own seed stream. The continuations store the shared head again under the same node, where
        the store shares it (so a fork point is a node boundary), and each counts only the tokens it
        sampled itself. The tree budget left after the first reply is split equally among all the
        paths; with less than a token each, nobody forks."""
        b.branched.add(b.turn)
        parent_engine = b.engine or self.engine
        gen = await parent_engine.generate(b.held_ids, replace(opts, entropies=True))  # type: ignore[union-attr]
        if gen.token_ids and len(gen.entropies) != len(gen.token_ids):
            raise ValueError(
                f"rollout.branch_policy=token: the engine {type(parent_engine).__name__} returned "
                f"{len(gen.entropies)} entropies for {len(gen.token_ids)} tokens; use rollout.engine=hf"
            )
        spots = fork_positions(gen.entropies, self.opt.branch_factor - 1, self.opt.branch_entropy)
        if (b.budget - len(gen.token_ids)) / (len(spots) + 1) < 1:
            spots = []
        clones: list[_Branch] = []
        for _ in spots:  # envs before the reply is acted on: each continuation acts on its own
            try:
                env = await self.fork_env(b)
            except InfrastructureFailure:  # no env for a continuation: fewer forks
                log.warning(
                    "an in-turn fork could not get an env; %d continuations instead of %d",
                    len(clones),
                    len(spots),
                    exc_info=True,
                )
                break
            clones.append(b.fork(env))
        spots = spots[: len(clones)]
        await self.store_generation(b, gen)
        self.hand_out(parent_engine, [b, *clones])
        self.emit("fork", turn=b.turn, positions=list(spots))

        async def first() -> list[LeafResult]:
            leaves = await self.act(b, gen)
            return leaves if leaves is not None else await self.run(b)

        results = await asyncio.gather(
            first(), *(self.continue_at(c, gen, p, opts) for c, p in zip(clones, spots, strict=True))
        )
        return [leaf for leaves in results for leaf in leaves]

    async def continue_at(
        self, c: _Branch, gen: Generation, at: int, opts: SamplingOptions
    ) -> list[LeafResult]:
        """The continuation of an in-turn fork: ``gen``'s first ``at`` tokens, then what ``c``'s
        engine samples from there; stored, acted on and run on like any reply."""
        head = gen.token_ids[:at]
        room = int(min(opts.max_tokens - at, c.budget, self.opt.max_context - len(c.held_ids) - at))
        tail = await (c.engine or self.engine).generate(  # type: ignore[union-attr]
            c.held_ids + head, replace(opts, max_tokens=max(1, room), entropies=False)
        )
        versions = gen.token_versions()[:at] + tail.token_versions()
        whole = Generation(
            token_ids=head + tail.token_ids,
            logprobs=gen.logprobs[:at] + tail.logprobs,
            version=min(versions),
            finish_reason=tail.finish_reason,
            versions=versions,
        )
        await self.store_generation(c, whole, sampled=len(tail.token_ids))
        leaves = await self.act(c, whole)
        return leaves if leaves is not None else await self.run(c)

    async def branch(self, b: _Branch) -> list[LeafResult]:
        """Fork ``b`` into ``branch_factor`` continuations, each with its own seed stream and an
        equal share of the remaining tree budget (:meth:`hand_out`)."""
        b.branched.add(b.turn)
        parent_engine = b.engine or self.engine
        clones = [b]
        for _ in range(self.opt.branch_factor - 1):
            try:
                env = await self.fork_env(b)
            except InfrastructureFailure as e:  # no env for a continuation: the branch ends here
                for c in clones[1:]:
                    with contextlib.suppress(Exception):
                        await in_env_thread(self.close_env, c.env)
                if b.turn == 0 and not b.actions:  # nothing sampled yet: as a failed reset
                    raise
                return [await self.finish(b, "aborted", failure=e)]
            clones.append(b.fork(env))
        self.hand_out(parent_engine, clones)
        results = await asyncio.gather(*(self.run(c) for c in clones))
        return [leaf for leaves in results for leaf in leaves]

    @staticmethod
    def hand_out(parent_engine: Any, paths: list[_Branch]) -> None:
        """Give each path of a fork its own seed stream (an engine with ``branch(i)``, the seeded
        view: path ``i``'s tokens then do not depend on how the paths interleave) and an equal share
        of the tree budget the first path holds now."""
        per_branch = getattr(parent_engine, "branch", None)
        share = paths[0].budget / len(paths)
        for i, c in enumerate(paths):
            if callable(per_branch):
                c.engine = per_branch(i)
            c.budget = share

    async def fork_env(self, b: _Branch) -> Any:
        fork = getattr(b.env.unwrapped, "fork", None) or getattr(b.env, "fork", None)
        if callable(fork):
            return await in_env_thread(fork)
        if self.make_env is None:
            raise ValueError("branching needs env.fork() or a make_env factory to replay the episode")
        return await in_env_thread(self._replay, b)

    def _replay(self, b: _Branch) -> Any:
        env = self.make_env()  # type: ignore[misc]
        try:
            return self._replay_into(env, b)
        except BaseException:
            with contextlib.suppress(Exception):  # a replay that failed must not leave its sandbox
                env.close()
            raise

    def _replay_into(self, env: Any, b: _Branch) -> Any:
        obs, _ = env.reset(seed=self.seed, options=self.reset_options)
        if obs != b.observations[0]:
            raise ForkMismatchError(
                f"env {env_name(env)}: replay with seed {self.seed} gave a different first observation; "
                "implement fork() or make reset deterministic in its seed"
            )
        for t, action in enumerate(b.actions):
            obs, *_ = env.step(action)
            if obs != b.observations[t + 1]:
                raise ForkMismatchError(
                    f"env {env_name(env)}: replaying turn {t} gave a different observation; "
                    "implement fork() or make the env deterministic in its seed"
                )
        return env
