"""One episode, as a state machine over its branches: reset, sample, step, append, fork, finish.

One episode, token by token::

    prompt   = chat_template([system?, examples..., user(first observation)], add_generation_prompt=True)
    repeat:  tokens = engine.generate(held)           # kept exactly as sampled (policy tokens)
             obs, r, done = env.step(decode(tokens))
             suffix = template(conversation + [assistant, user(obs)])[len(held text):]
             held += tokens + encode(suffix)          # observation tokens (not policy)

Token truth. The sampled ids are never re-tokenised: the trainer sees exactly what the engine
sampled, with the engine's behaviour log-probs and per-token policy versions. The chat template
is only asked for the *text that follows* what is already held. If the re-rendered conversation
does not start with the held text (a template that rewrites earlier turns, e.g. strips whitespace
or reasoning from past assistant messages), that is :class:`~fr_agents.rollout.encoding.TokenDriftError`
naming the turn, never a silent fix. The suffix must round-trip through the tokenizer exactly, too
(:mod:`fr_agents.rollout.encoding`).

Storage. Every segment is appended to the :class:`~fr_agents.tree.TrajectoryTree` as soon as it
exists (the prompt as root, each generation split into runs of equal policy version, each
observation as non-policy tokens), so an unfinished episode's prefix is already stored. The writes
go through the tree-writer thread (:mod:`fr_agents.rollout.writer`); a finish is on disk before
:func:`run_episode` returns.

Limits. ``max_new_tokens`` caps one turn; ``max_context`` caps the whole token sequence;
``max_turns`` caps the replies. A branch cut by one of these budgets ends ``truncated`` with a
partial score: the env's last ``info["partial_score"]``, or, when that step reported none, what the
env's own ``env.unwrapped.partial_score()`` says now (an env whose progress is costly to measure,
like RepoCoding-v0 running its tests, scores only the branches that are cut). When the env's steps
report a partial score, the leaf's ``info["progress_turn"]`` says after how many replies it first
reached its best (0: never above 0; a score that falls and comes back is no new progress), so that
``rollout.reward: progress`` pays a cut leaf's score to those replies only.

Branching. At the turns of ``branch_at`` an episode forks into branches that share their prefix
in the tree, before a reply or inside it, within a tree token budget: :mod:`fr_agents.rollout.branching`.

Infrastructure failures. An env raises :class:`~fr_agents.errors.InfrastructureFailure` when its
grader or sandbox could not judge a step (the sandbox died, the verifier pool crashed, the grader
ran past its own deadline). The branch then ends ``aborted``: its leaf is stored as sampled (token
truth), with ``info["aborted_by"]`` (the failure's reason) and ``info["abort_message"]``, and no
reward is claimed for it; a trainer leaves such leaves out and runs the episode again (see
``trainer/episodes.py``). The same holds for a cut branch whose ``partial_score()`` fails, and for a
fork that cannot get its env. A failure in ``reset`` (nothing sampled yet) propagates.

A scripted ``actor`` may reply instead of the engine (:mod:`fr_agents.rollout.experts`); many episodes
run at once with :func:`fr_agents.rollout.batch.run_episodes`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fr_agents.errors import InfrastructureFailure
from fr_agents.policy.base import Engine, Generation, SamplingOptions
from fr_agents.rollout.branching import Branching, _Branch
from fr_agents.rollout.encoding import (
    TokenDriftError,
    decode,
    default_stop_ids,
    encode_exact,
    encode_prompt,
    prompt_messages,
    render,
)
from fr_agents.rollout.env_thread import env_name, in_env_thread
from fr_agents.rollout.options import Actor, EpisodeResult, EventFn, LeafResult, RolloutOptions
from fr_agents.rollout.writer import tree_write, tree_write_durable

log = logging.getLogger(__name__)


class ObservationTypeError(TypeError):
    """An env returned an observation that is not a ``str``."""


def _check_obs(env: Any, obs: Any, where: str) -> str:
    if not isinstance(obs, str):
        raise ObservationTypeError(
            f"env {env_name(env)} returned a {type(obs).__name__} observation from {where}; "
            "fr-agents drives text envs whose observations are str (see fr_agents.spaces.AnyText)"
        )
    return obs


def _json_safe(value: Any) -> Any:
    import json

    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _partial(info: dict[str, Any]) -> float | None:
    ps = info.get("partial_score")
    if isinstance(ps, (int, float)) and not isinstance(ps, bool) and 0.0 <= float(ps) <= 1.0:
        return float(ps)
    return None


class _Episode(Branching):
    """One episode in progress (all its branches), against one engine and one tree: the state
    machine behind :func:`run_episode` (its forks: :class:`~fr_agents.rollout.branching.Branching`)."""

    def __init__(
        self,
        make_env: Callable[[], Any] | None,
        engine: Engine | None,
        tokenizer: Any,
        tree: Any,
        options: RolloutOptions,
        seed: int,
        reset_options: dict[str, Any] | None,
        on_event: EventFn | None,
        actor: Actor | None = None,
    ) -> None:
        if engine is None and actor is None:
            raise ValueError("engine: give an engine or a scripted actor")
        self.make_env = make_env
        self.engine = engine
        self.actor = actor
        self.agent = (
            getattr(actor, "__name__", type(actor).__name__).removesuffix("_actor") if actor else None
        )
        self.tok = tokenizer
        self.tree = tree
        self.opt = options
        self.seed = seed
        self.reset_options = reset_options
        self.on_event = on_event
        self.env: Any = None  # the episode's env once made (start)
        self._closed: set[int] = set()  # ids of this episode's envs already closed (close_env)
        stops = options.stop_token_ids if options.stop_token_ids is not None else default_stop_ids(tokenizer)
        self.stop_ids = tuple(int(t) for t in stops)
        self.sampling = SamplingOptions(
            temperature=options.temperature,
            max_tokens=options.max_new_tokens,
            stop_token_ids=self.stop_ids,
            stop_strings=tuple(options.stop_strings),
            top_p=options.top_p,
            top_k=options.top_k,
            importance_correction=options.importance_correction,
        )

    def emit(self, kind: str, **payload: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)

    # ------------------------------------------------------------------ start

    async def start(self, env: Any) -> EpisodeResult:
        """Reset ``env`` (``None``: make it with ``make_env`` first, in the same env-thread call),
        store the prompt as the tree's root and run the episode."""

        def make_and_reset() -> tuple[Any, Any]:
            self.env = env if env is not None else self.make_env()  # type: ignore[misc]
            return self.env.reset(seed=self.seed, options=self.reset_options)

        obs, info = await in_env_thread(make_and_reset)
        env = self.env
        obs = _check_obs(env, obs, "reset()")
        messages = prompt_messages(obs, self.opt.system_prompt, self.opt.examples)
        text, ids = encode_prompt(self.tok, obs, self.opt.system_prompt, self.opt.examples)
        if len(ids) >= self.opt.max_context:
            raise ValueError(
                f"max_context: the prompt alone is {len(ids)} tokens, max_context is {self.opt.max_context}"
            )
        meta = {
            "env": env_name(env),
            "seed": self.seed,
            "task": _json_safe((self.reset_options or {}).get("task")),
        }
        if self.agent:
            meta["agent"] = self.agent
        root = await tree_write(self.tree.add_root, ids, meta=meta)
        self.emit("prompt", text=text, observation=obs)
        branch = _Branch(env, messages, list(ids), text, root, info=dict(info or {}), observations=[obs])
        if self.opt.tree_budget_tokens:
            branch.budget = float(self.opt.tree_budget_tokens)
        leaves = await self.run(branch)
        return EpisodeResult(root_id=root, seed=self.seed, leaves=leaves)

    # ------------------------------------------------------------------ turns

    async def run(self, b: _Branch) -> list[LeafResult]:
        while True:
            if self.should_branch(b):
                return await self.branch(b)
            if b.budget < 1:
                return [await self.finish(b, "truncated", reason="tree_budget")]
            budget = self.opt.max_context - len(b.held_ids)
            if budget < 1:
                return [await self.finish(b, "truncated", reason="context")]
            opts = self.sampling
            if min(budget, b.budget) < opts.max_tokens:
                opts = replace(opts, max_tokens=int(min(budget, b.budget)))
            if self.actor is not None:
                gen = await self.scripted_reply(b, budget)
                if gen is None:
                    return [await self.finish(b, "truncated", reason="context")]
            elif self.forks_in_turn(b):
                return await self.branch_in_turn(b, opts)
            else:
                gen = await (b.engine or self.engine).generate(b.held_ids, opts)  # type: ignore[union-attr]
                await self.store_generation(b, gen)
            leaves = await self.act(b, gen)
            if leaves is not None:
                return leaves

    async def act(self, b: _Branch, gen: Generation) -> list[LeafResult] | None:
        """Step ``b``'s env with the reply ``gen`` (already stored) and append the observation; the
        branch's leaves when that ended it, else None (the branch goes on)."""
        action = self.action_text(gen)
        self.emit("action", turn=b.turn, text=action, finish_reason=gen.finish_reason)
        env = b.env
        try:
            obs, reward, terminated, truncated, info = await in_env_thread(self.step_env, env, action)
        except InfrastructureFailure as e:  # the grader could not judge it: not a reward of 0
            return [await self.finish(b, "aborted", failure=e)]
        obs = _check_obs(env, obs, f"step() at turn {b.turn}")
        b.actions.append(action)
        b.observations.append(obs)
        b.rewards.append(float(reward))
        b.info = dict(info or {})
        b.turn += 1
        score = _partial(b.info)
        if score is not None:
            if score > b.partial_best:  # above every score before: the replies so far made it
                b.partial_best, b.progress_turn = score, b.turn
            elif b.progress_turn is None:
                b.progress_turn = 0
        self.emit(
            "observation", turn=b.turn - 1, text=obs, reward=float(reward), done=terminated or truncated
        )
        if terminated:
            return [await self.finish(b, "finished")]
        if truncated or b.turn >= self.opt.max_turns:
            return [await self.finish(b, "truncated", reason="env" if truncated else "max_turns")]
        if not await self.append_observation(b, action, obs):
            return [await self.finish(b, "truncated", reason="context")]
        return None

    def step_env(self, env: Any, action: str) -> tuple[Any, Any, bool, bool, Any]:
        """``env.step(action)`` in an env thread. A step that ends the episode (terminated or
        truncated by the env) also closes the env in the same call: nothing after it needs the env
        (a partial score is asked for only on a cut the env did not make), and the episode saves a
        thread hop."""
        out = env.step(action)
        if out[2] or out[3]:
            self.close_env(env)
        return out

    def close_env(self, env: Any) -> None:
        """Close ``env`` once (the end of its branch and the error path may both ask)."""
        if env is None or id(env) in self._closed:
            return
        self._closed.add(id(env))
        env.close()

    def action_text(self, gen: Generation) -> str:
        ids = gen.token_ids
        if gen.finish_reason == "stop" and ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return decode(self.tok, ids)

    async def store_generation(self, b: _Branch, gen: Generation, sampled: int | None = None) -> None:
        """Append the reply's tokens (split into runs of equal version) and extend the held text.
        ``sampled``: how many of them this branch sampled itself (default all; an in-turn fork's
        continuation stores the shared head of its reply again, and the store shares it)."""
        versions = gen.token_versions()
        start = 0
        for i in range(1, len(versions) + 1):
            if i == len(versions) or versions[i] != versions[start]:
                b.node = await tree_write(
                    self.tree.append,
                    b.node,
                    gen.token_ids[start:i],
                    gen.logprobs[start:i],
                    True,
                    versions[start],
                )
                start = i
        ids = gen.token_ids
        b.turn_starts.append(len(b.held_text))
        stop_tail = gen.finish_reason == "stop" and ids and ids[-1] in self.stop_ids
        body = ids[:-1] if stop_tail else ids
        b.held_text += decode(self.tok, body) + (decode(self.tok, ids[-1:]) if stop_tail else "")
        b.held_ids.extend(ids)
        own = len(ids) if sampled is None else sampled
        b.policy_tokens += len(ids)
        b.sampled += own
        b.budget -= own
        b.surprisal = -sum(gen.logprobs) / len(gen.logprobs) if gen.logprobs else 0.0

    async def scripted_reply(self, b: _Branch, budget: int) -> Generation | None:
        """Store the actor's reply as non-policy tokens (text + end-of-turn); None when it does not fit."""
        text = await in_env_thread(self.actor, b.env)
        eot = self.end_of_turn(b, text)
        ids = encode_exact(self.tok, text, b.turn) + eot
        if len(ids) > budget:
            return None
        start = len(b.held_ids)
        b.node = await tree_write(self.tree.append, b.node, ids, None, False, -1)
        b.demo_spans.append((start, start + len(ids)))
        b.turn_starts.append(len(b.held_text))
        b.held_text += text + decode(self.tok, eot)
        b.held_ids.extend(ids)
        return Generation(token_ids=list(ids), logprobs=[], version=-1, finish_reason="stop")

    def end_of_turn(self, b: _Branch, text: str) -> list[int]:
        """The stop token the chat template closes an assistant reply with (what a policy samples)."""
        rendered = self.tok.apply_chat_template(
            [*b.messages, {"role": "assistant", "content": text}], tokenize=False
        )
        head = b.held_text + text
        if rendered.startswith(head):
            tail = rendered[len(head) :]
            for sid in self.stop_ids:
                if tail.startswith(decode(self.tok, [sid])):
                    return [sid]
        return list(self.stop_ids[:1])

    async def append_observation(self, b: _Branch, action: str, obs: str) -> bool:
        """Template the next observation onto the held tokens; False when it does not fit."""
        messages = [
            *b.messages,
            {"role": "assistant", "content": action},
            {"role": self.opt.observation_role, "content": obs},
        ]
        text = render(self.tok, messages)
        if not text.startswith(b.held_text):
            at = next(
                (i for i, (x, y) in enumerate(zip(text, b.held_text, strict=False)) if x != y),
                min(len(text), len(b.held_text)),
            )
            drifted = max((t for t, start in enumerate(b.turn_starts) if start <= at), default=0)
            raise TokenDriftError(
                drifted,
                f"the chat template re-renders the conversation (while appending the observation of turn "
                f"{b.turn - 1}) so that it no longer starts with the held tokens (first difference at "
                f"character {at}: held {b.held_text[at : at + 40]!r}, template {text[at : at + 40]!r})",
            )
        suffix = text[len(b.held_text) :]
        ids = encode_exact(self.tok, suffix, b.turn)
        if len(b.held_ids) + len(ids) >= self.opt.max_context:
            return False
        b.node = await tree_write(self.tree.append, b.node, ids, None, False, -1)
        b.held_ids.extend(ids)
        b.held_text = text
        b.messages = messages
        return True

    async def finish(
        self, b: _Branch, status: str, reason: str | None = None, failure: InfrastructureFailure | None = None
    ) -> LeafResult:
        """Store ``b``'s path as a leaf with ``status`` (``reason``: what cut a truncated branch;
        ``failure``: why an aborted one could not be graded) and close its env."""
        from fr_agents.tree import DuplicateLeafError

        reward = 0.0
        if b.rewards:  # an aborted leaf keeps the rewards of the turns before the failure
            reward = sum(b.rewards) if self.opt.turn_reward == "sum" else b.rewards[-1]
        partial = _partial(b.info) if failure is None else None
        scorer = getattr(getattr(b.env, "unwrapped", b.env), "partial_score", None)
        if partial is None and status == "truncated" and reason != "env" and callable(scorer):
            try:
                partial = _partial({"partial_score": await in_env_thread(scorer)})
            except InfrastructureFailure as e:  # the cut branch cannot be scored: no outcome
                status, failure = "aborted", e
        info = {"turns": b.turn, "rewards": b.rewards}
        if b.progress_turn is not None:
            info["progress_turn"] = b.progress_turn
        if reason:
            info["truncated_by"] = reason
        if failure is not None:
            info["aborted_by"] = failure.reason
            info["abort_message"] = str(failure)[:2000]
        for key in ("won", "tool_calls"):
            if key in b.info:
                info[key] = _json_safe(b.info[key])
        if self.agent:
            info["agent"] = self.agent
            info["demo_spans"] = [list(s) for s in b.demo_spans]
        try:
            # durable before the episode counts as done: the writer fsyncs the run it commits with
            leaf = await tree_write_durable(
                self.tree.finish,
                b.node,
                reward,
                partial_score=partial,
                status=status,
                info=info,
                durable=False,
            )
        except DuplicateLeafError as e:  # an identical path was already stored: it is that leaf
            leaf = e.leaf_id
        self.emit("finish", status=status, reward=reward, partial_score=partial, turns=b.turn)
        if b.env is not None and id(b.env) not in self._closed:
            if failure is None:
                await in_env_thread(self.close_env, b.env)
            else:  # its sandbox may be gone already: a failing close must not hide the abort
                try:
                    await in_env_thread(self.close_env, b.env)
                except Exception as e:  # noqa: BLE001 - logged; the leaf is stored
                    log.warning("closing the env of an aborted branch failed: %r", e)
        return LeafResult(
            leaf, reward, status, partial, b.turn, b.policy_tokens, list(b.rewards), info, b.sampled
        )


async def run_episode(
    env: Any,
    engine: Engine | None,
    tokenizer: Any,
    tree: Any,
    options: RolloutOptions | None = None,
    *,
    seed: int | None = None,
    task: Any = None,
    make_env: Callable[[], Any] | None = None,
    on_event: EventFn | None = None,
    actor: Actor | None = None,
) -> EpisodeResult:
    """Run one episode of ``env`` and store it in ``tree``.

    ``env``: the env, already made; or ``None`` with ``make_env``, which then makes it in the same
    env-thread call that resets it (one thread hop less per episode).
    ``task`` is passed as ``reset(options={"task": task})``; ``make_env`` makes a fresh env for
    replay-forking (default: ``gymnasium.make(env.spec)`` when the env has a spec). The env is
    closed at the end of each branch. ``actor`` (e.g. :func:`expert_actor`) replies instead of
    ``engine`` (which may then be None); its tokens are stored as non-policy tokens.
    """
    options = options or RolloutOptions()
    if seed is None:
        seed = random.randrange(2**31)
    if env is None and make_env is None:
        raise ValueError("env: give an env, or None together with make_env")
    if make_env is None and getattr(env, "spec", None) is not None:
        import gymnasium

        spec = env.spec
        make_env = lambda: gymnasium.make(spec)  # noqa: E731
    episode = _Episode(
        make_env,
        engine,
        tokenizer,
        tree,
        options,
        seed,
        {"task": task} if task is not None else None,
        on_event,
        actor,
    )
    try:
        return await episode.start(env)
    except BaseException:
        try:
            episode.close_env(episode.env if episode.env is not None else env)
        except Exception as e:  # noqa: BLE001 - the episode's own error is the one to raise
            log.warning("closing the env of a failed episode failed: %r", e)
        raise
