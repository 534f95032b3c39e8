"""The token-truthful multi-turn episode runner.

One episode, token by token::

    prompt   = chat_template([system?, user(first observation)], add_generation_prompt=True)
    repeat:  tokens = engine.generate(held)           # kept exactly as sampled (policy tokens)
             obs, r, done = env.step(decode(tokens))
             suffix = template(conversation + [assistant, user(obs)])[len(held text):]
             held += tokens + encode(suffix)          # observation tokens (not policy)

Token truth. The sampled ids are never re-tokenised: the trainer sees exactly what the engine
sampled, with the engine's behaviour log-probs and per-token policy versions. The chat template
is only asked for the *text that follows* what is already held. If the re-rendered conversation
does not start with the held text (a template that rewrites earlier turns, e.g. strips whitespace
or reasoning from past assistant messages), that is :class:`TokenDriftError` naming the turn,
never a silent fix. The suffix must round-trip through the tokenizer exactly, too.

Storage. Every segment is appended to the :class:`~fr_agents.tree.TrajectoryTree` as soon as it
exists (the prompt as root, each generation split into runs of equal policy version, each
observation as non-policy tokens), so an unfinished episode's prefix is already stored.

Limits. ``max_new_tokens`` caps one turn; ``max_context`` caps the whole token sequence;
``max_turns`` caps the replies. A branch cut by one of these budgets ends ``truncated`` with a
partial score: the env's last ``info["partial_score"]``, or, when that step reported none, what the
env's own ``env.unwrapped.partial_score()`` says now (an env whose progress is costly to measure,
like RepoCoding-v0 running its tests, scores only the branches that are cut).

Branching. At each turn boundary named in ``branch_at`` (0 = before the first action) the episode
forks into ``branch_factor`` continuations sharing the prefix in the tree. The env is forked with
its ``fork()`` method when it has one; otherwise a fresh env is made, reset with the same seed and
task, and the action prefix is replayed, checking that every observation matches.

Adaptive branching. With ``branch_policy="entropy"`` the turns of ``branch_at`` are candidates: a
path forks there only when its last action was uncertain, i.e. the mean surprisal of its sampled
tokens (minus the mean behaviour log-prob, an estimate of the policy's entropy there) is at least
``branch_entropy`` (turn 0 has no last action and always forks). Confident turns are not re-sampled, uncertain ones get ``branch_factor``
continuations; a path's decision depends only on its own tokens (deterministic for exact resume),
and a tree still has at most ``branch_factor ** len(branch_at)`` leaves.

Tree token budget. ``tree_budget_tokens`` (0: none) bounds the policy tokens one episode tree
samples: the root branch holds the whole budget, and at each fork the remaining budget is split
equally among the continuations (so the total never exceeds it, and which branch is cut does not
depend on how the branches interleave). A branch whose share is spent ends ``truncated`` at its next
turn boundary (``truncated_by: tree_budget``), scored like any cut branch.

Infrastructure failures. An env raises :class:`~fr_agents.errors.InfrastructureFailure` when its
grader or sandbox could not judge a step (the sandbox died, the verifier pool crashed, the grader
ran past its own deadline). The branch then ends ``aborted``: its leaf is stored as sampled (token
truth), with ``info["aborted_by"]`` (the failure's reason) and ``info["abort_message"]``, and no
reward is claimed for it; a trainer leaves such leaves out and runs the episode again (see
``trainer/episodes.py``). The same holds for a cut branch whose ``partial_score()`` fails, and for a
fork that cannot get its env. A failure in ``reset`` (nothing sampled yet) propagates.

Scripted actors (``--agent expert``). ``actor=fn`` replaces the engine: ``fn(env)`` returns each
reply (:func:`expert_actor` asks the env's own expert). Its tokens are encoded text, not samples:
they are stored with ``policy_mask=False`` (no behaviour log-prob, version -1), so the trainer's
objective never counts them as sampled. To keep the store usable as SFT demos, each leaf's ``info``
names the ``agent`` and lists ``demo_spans``: ``[start, end)`` token offsets (on the root-to-leaf
path) of every scripted reply, end-of-turn token included, i.e. where a supervised loss belongs.

Concurrency. Episodes are coroutines; :func:`run_episodes` runs many against one engine (which
batches their requests). Env calls run in a thread pool so a slow env does not stall the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
import queue
import random
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fr_agents import defaults, hops
from fr_agents.errors import InfrastructureFailure
from fr_agents.policy.base import Engine, Generation, SamplingOptions

log = logging.getLogger(__name__)

_ENV_POOL = hops.HopPool(max_workers=64, name="fr-env")


_Write = tuple[Any, Callable[[], Any], Callable[[hops.Outcome], None], bool]  # (tree, write, tell, durable)


class _TreeWriter:
    """The tree's writer thread, with group commit.

    Tree writes (SQLite) run on one thread so that they never stall the event loop, and in the
    order they were queued, so each episode's writes stay in order. The thread takes every write
    queued at that moment (up to ``max_group``) and runs a run of writes to the same tree inside
    one transaction (``TrajectoryTree.group``): each write is its own savepoint (a write that
    raises is undone alone and its caller gets the error), and the run commits once. Callers
    are told after that commit, so a write is in the database when its caller resumes. One commit
    per write would write pages to the WAL three times per episode.

    A write submitted ``durable=True`` (a finished trajectory) resolves only after the run it
    committed with is also fsynced (``tree.sync()``): one fsync per run, however many durable
    writes it holds, and no second thread hop per episode to ask for it.
    """

    def __init__(self, max_group: int = 256) -> None:
        self.max_group = max_group
        self._queue: queue.SimpleQueue[_Write] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def put(self, tree: Any, fn: Callable[[], Any], tell: Callable[[hops.Outcome], None], *, durable: bool = False) -> None:
        """Queue ``fn()`` (a write to ``tree``); ``tell(outcome)`` runs on the writer thread once the
        write is committed (``durable``: and fsynced)."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fr-tree", daemon=True)
                self._thread.start()
        self._queue.put((tree, fn, tell, durable))

    def submit(self, tree: Any, fn: Callable[[], Any], *, durable: bool = False) -> concurrent.futures.Future:
        """:meth:`put` for threads: the returned future resolves once the write is committed."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.put(tree, fn, hops.teller(fut), durable=durable)
        return fut

    async def write(self, tree: Any, fn: Callable[[], Any], *, durable: bool = False) -> Any:
        """:meth:`put` for the event loop: the result of ``fn()`` once it is committed."""
        fut, tell = hops.awaiter()
        self.put(tree, fn, tell, durable=durable)
        return await fut

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self.max_group:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            start = 0
            while start < len(items):  # runs of consecutive writes to the same tree
                end = start + 1
                while end < len(items) and items[end][0] is items[start][0]:
                    end += 1
                self._commit(items[start:end])
                start = end

    @staticmethod
    def _commit(run: list[_Write]) -> None:
        tree = run[0][0]
        group = getattr(tree, "group", None)
        outcomes: list[hops.Outcome] = []
        try:
            with group() if callable(group) else contextlib.nullcontext():
                for _, fn, _, _ in run:
                    outcomes.append(hops.run(fn))  # this write's own error goes to its caller
        except BaseException as e:  # noqa: BLE001 - the commit failed: none of the run is stored
            outcomes = [(False, e)] * len(run)
        else:
            sync = getattr(tree, "sync", None)
            if callable(sync) and any(w[3] for w in run):
                failed = hops.run(sync)
                if not failed[0]:  # not durable: the durable writes fail with it
                    outcomes = [failed if w[3] else o for w, o in zip(run, outcomes, strict=True)]
        for (_, _, tell, _), outcome in zip(run, outcomes, strict=True):
            try:
                tell(outcome)
            except Exception:  # noqa: BLE001 - one caller's failure must not stop the writer or the others
                log.exception("tree writer: handing a caller its outcome failed")


_TREE_WRITER = _TreeWriter()


class TokenDriftError(RuntimeError):
    """The chat template re-renders an earlier turn differently from the tokens already held."""

    def __init__(self, turn: int, detail: str) -> None:
        super().__init__(f"token drift at turn {turn}: {detail}")
        self.turn = turn


class ObservationTypeError(TypeError):
    """An env returned an observation that is not a ``str``."""


class NoExpertError(ValueError):
    """``--agent expert`` on an env without ``expert_action()``."""


class ForkMismatchError(RuntimeError):
    """Replaying the action prefix on a fresh env did not reproduce the recorded observations."""


@dataclass(frozen=True)
class RolloutOptions:
    """How episodes are run. ``branch_at`` lists turn boundaries (0 = before the first action)."""

    temperature: float = defaults.TEMPERATURE
    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    max_context: int = defaults.MAX_CONTEXT
    max_turns: int = defaults.MAX_TURNS
    system_prompt: str | None = None
    examples: tuple[tuple[str, str], ...] = ()  # (role, content) turns between the system message and the first observation
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
    branch_policy: Literal["fixed", "entropy"] = "fixed"
    branch_entropy: float = 0.0  # entropy policy: fork when the last action's mean surprisal >= this

    def __post_init__(self) -> None:
        if self.branch_policy not in ("fixed", "entropy"):
            raise ValueError(f"branch_policy must be 'fixed' or 'entropy', got {self.branch_policy!r}")
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
    demo_spans: list[list[int]] = field(default_factory=list)  # token spans of scripted (non-policy) replies
    engine: Any = None  # this branch's engine view (None: the runner's engine)
    budget: float = float("inf")  # this branch's share of the tree's policy-token budget
    surprisal: float = 0.0  # mean -log p of the last sampled action (0 for scripted replies)


EventFn = Callable[[str, dict[str, Any]], None]
Actor = Callable[[Any], str]
"""A scripted actor: given the (wrapped) env, the text of its next reply."""


def expert_actor(env: Any) -> str:
    """The env's own expert's next reply (the actor of ``--agent expert``).

    ``env.unwrapped.expert_reply()`` when the env has it (the reply in the env's action format,
    e.g. ALFWorld's ``<action>cmd</action>``), else ``env.unwrapped.expert_action()`` verbatim.
    """
    inner = getattr(env, "unwrapped", env)
    if callable(getattr(inner, "expert_reply", None)):
        return str(inner.expert_reply())
    if callable(getattr(inner, "expert_action", None)):
        return str(inner.expert_action())
    raise NoExpertError(
        f"env {_env_name(env)} has no expert: --agent expert needs env.unwrapped.expert_action() "
        "(fr_agents/ALFWorld-v0 has one)"
    )


def has_expert(env: Any) -> bool:
    """Whether :func:`expert_actor` can drive ``env``."""
    return callable(getattr(getattr(env, "unwrapped", env), "expert_action", None))


def require_expert(make_env: Callable[[], Any], env_id: str) -> None:
    """Raise :class:`~fr_agents.config.ConfigError` naming ``env_id`` when its env has no expert."""
    from fr_agents.config import ConfigError

    env = make_env()
    try:
        if not has_expert(env):
            raise ConfigError(
                f"--agent expert: env {env_id} has no expert (its env.unwrapped has no expert_action(); "
                "fr_agents/ALFWorld-v0 has one)"
            )
    finally:
        env.close()


def default_stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids of a chat tokenizer: its eos plus the usual ChatML/Llama turn ends.

    Computed once per tokenizer object (reading the vocabulary costs about a millisecond, which
    every episode would otherwise pay)."""
    try:
        return _STOP_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    stops = _find_stop_ids(tokenizer)
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _STOP_IDS[tokenizer] = stops
    return stops


_STOP_IDS: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


def _find_stop_ids(tokenizer: Any) -> tuple[int, ...]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return tuple(sorted(ids))


def _env_name(env: Any) -> str:
    base = getattr(env, "unwrapped", env)
    # the base env's own spec: a wrapper's ``spec`` property deep-copies it on every read
    spec = getattr(base, "spec", None) or getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(base).__name__


def _check_obs(env: Any, obs: Any, where: str) -> str:
    if not isinstance(obs, str):
        raise ObservationTypeError(
            f"env {_env_name(env)} returned a {type(obs).__name__} observation from {where}; "
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


async def _in_thread(fn: Callable[..., Any], *a: Any) -> Any:
    return await _ENV_POOL.call(fn, *a)


async def _tree(fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """Run the tree write ``fn(*a, **kw)`` (a bound method of the tree) on the tree's writer thread."""
    return await _TREE_WRITER.write(getattr(fn, "__self__", None), lambda: fn(*a, **kw))


async def _tree_durable(fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """As :func:`_tree`, returning only once the write is also on disk (the writer's group fsync)."""
    return await _TREE_WRITER.write(getattr(fn, "__self__", None), lambda: fn(*a, **kw), durable=True)


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


_DIRECT_CLASSES: dict[type, bool] = {}


def _direct(tokenizer: Any) -> Any | None:
    """The Rust ``tokenizers.Tokenizer`` behind ``tokenizer`` when calling it directly gives exactly
    what ``tokenizer.encode(text, add_special_tokens=False)`` and ``tokenizer.decode(ids,
    skip_special_tokens=False, clean_up_tokenization_spaces=False)`` give; ``None`` otherwise.

    A transformers fast tokenizer does its work in that backend; the Python around it (argument
    checks, padding and truncation set-up, a ``BatchEncoding`` per call) costs most of the time an
    episode's prompt takes to encode and check on math-tiny's rollout. The direct call is taken only
    where the wrapper adds nothing: the tokenizer's class keeps transformers' own ``encode`` /
    ``decode`` (a class that overrides them is always asked itself), and the backend holds no
    truncation or padding and splits special tokens as the wrapper would ask it to (the wrapper
    resets those per call; a backend left configured otherwise goes through the wrapper)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        return None
    cls = type(tokenizer)
    plain = _DIRECT_CLASSES.get(cls)
    if plain is None:
        try:
            from transformers.tokenization_utils_base import PreTrainedTokenizerBase
            from transformers.tokenization_utils_tokenizers import TokenizersBackend
        except ImportError:  # another transformers layout: always ask the tokenizer
            plain = False
        else:
            plain = (
                isinstance(tokenizer, TokenizersBackend)
                and all(
                    getattr(cls, name) is getattr(PreTrainedTokenizerBase, name)
                    for name in ("encode", "decode", "_get_padding_truncation_strategies")
                )
                and all(
                    getattr(cls, name) is getattr(TokenizersBackend, name)
                    for name in ("_encode_plus", "_decode", "set_truncation_and_padding")
                )
            )
        _DIRECT_CLASSES[cls] = plain
    if not plain or backend.truncation is not None or backend.padding is not None:
        return None
    if backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return backend


def _encode_exact(tokenizer: Any, text: str, turn: int) -> list[int]:
    direct = _direct(tokenizer)
    if direct is not None:
        ids = direct.encode(text, add_special_tokens=False).ids
        back = direct.decode(ids, skip_special_tokens=False)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != text:
        raise TokenDriftError(
            turn,
            f"the tokenizer does not round-trip the appended text {text[:80]!r} (decodes to {back[:80]!r})",
        )
    return list(ids)


def prompt_messages(
    observation: str, system_prompt: str | None = None, examples: Sequence[tuple[str, str]] = ()
) -> list[dict[str, str]]:
    """The chat messages of an episode's first turn: the system prompt (if any), the example
    turns (``(role, content)`` pairs: a worked example shown in the chat template), then the
    observation as the user's message."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": role, "content": content} for role, content in examples]
    return [*messages, {"role": "user", "content": observation}]


def example_turns(examples: Sequence[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    """``env.examples`` (``{role, content}`` mappings) as the ``(role, content)`` pairs
    :class:`RolloutOptions` holds."""
    return tuple((str(t["role"]), str(t["content"])) for t in examples)


def encode_prompt(
    tokenizer: Any, observation: str, system_prompt: str | None = None, examples: Sequence[tuple[str, str]] = ()
) -> tuple[str, list[int]]:
    """The prompt of an episode, as text and token ids: the chat template of
    :func:`prompt_messages` with the generation prompt, encoded with the round-trip check (a
    tokenizer that does not decode the ids back to the text raises :class:`TokenDriftError`).
    The one prompt encoder: rollout, training, evaluation and warm-start demos all use it."""
    text = _render(tokenizer, prompt_messages(observation, system_prompt, examples))
    return text, _encode_exact(tokenizer, text, 0)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    direct = _direct(tokenizer)
    if direct is not None:
        return direct.decode(list(ids), skip_special_tokens=False)
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


class _Runner:
    """Runs one episode (all its branches) against one engine and one tree."""

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
        self.agent = getattr(actor, "__name__", type(actor).__name__).removesuffix("_actor") if actor else None
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

        obs, info = await _in_thread(make_and_reset)
        env = self.env
        obs = _check_obs(env, obs, "reset()")
        messages = prompt_messages(obs, self.opt.system_prompt, self.opt.examples)
        text, ids = encode_prompt(self.tok, obs, self.opt.system_prompt, self.opt.examples)
        if len(ids) >= self.opt.max_context:
            raise ValueError(
                f"max_context: the prompt alone is {len(ids)} tokens, max_context is {self.opt.max_context}"
            )
        meta = {
            "env": _env_name(env),
            "seed": self.seed,
            "task": _json_safe((self.reset_options or {}).get("task")),
        }
        if self.agent:
            meta["agent"] = self.agent
        root = await _tree(self.tree.add_root, ids, meta=meta)
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
            else:
                gen = await (b.engine or self.engine).generate(b.held_ids, opts)  # type: ignore[union-attr]
                await self.store_generation(b, gen)
            action = self.action_text(gen)
            self.emit("action", turn=b.turn, text=action, finish_reason=gen.finish_reason)
            env = b.env
            try:
                obs, reward, terminated, truncated, info = await _in_thread(self.step_env, env, action)
            except InfrastructureFailure as e:  # the grader could not judge it: not a reward of 0
                return [await self.finish(b, "aborted", failure=e)]
            obs = _check_obs(env, obs, f"step() at turn {b.turn}")
            b.actions.append(action)
            b.observations.append(obs)
            b.rewards.append(float(reward))
            b.info = dict(info or {})
            b.turn += 1
            self.emit(
                "observation", turn=b.turn - 1, text=obs, reward=float(reward), done=terminated or truncated
            )
            if terminated:
                return [await self.finish(b, "finished")]
            if truncated or b.turn >= self.opt.max_turns:
                return [await self.finish(b, "truncated", reason="env" if truncated else "max_turns")]
            if not await self.append_observation(b, action, obs):
                return [await self.finish(b, "truncated", reason="context")]

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
        return _decode(self.tok, ids)

    async def store_generation(self, b: _Branch, gen: Generation) -> None:
        """Append the sampled tokens (split into runs of equal version) and extend the held text."""
        versions = gen.token_versions()
        start = 0
        for i in range(1, len(versions) + 1):
            if i == len(versions) or versions[i] != versions[start]:
                b.node = await _tree(
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
        b.held_text += _decode(self.tok, body) + (_decode(self.tok, ids[-1:]) if stop_tail else "")
        b.held_ids.extend(ids)
        b.policy_tokens += len(ids)
        b.sampled += len(ids)
        b.budget -= len(ids)
        b.surprisal = -sum(gen.logprobs) / len(gen.logprobs) if gen.logprobs else 0.0

    async def scripted_reply(self, b: _Branch, budget: int) -> Generation | None:
        """Store the actor's reply as non-policy tokens (text + end-of-turn); None when it does not fit."""
        text = await _in_thread(self.actor, b.env)
        eot = self.end_of_turn(b, text)
        ids = _encode_exact(self.tok, text, b.turn) + eot
        if len(ids) > budget:
            return None
        start = len(b.held_ids)
        b.node = await _tree(self.tree.append, b.node, ids, None, False, -1)
        b.demo_spans.append([start, start + len(ids)])
        b.turn_starts.append(len(b.held_text))
        b.held_text += text + _decode(self.tok, eot)
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
                if tail.startswith(_decode(self.tok, [sid])):
                    return [sid]
        return list(self.stop_ids[:1])

    async def append_observation(self, b: _Branch, action: str, obs: str) -> bool:
        """Template the next observation onto the held tokens; False when it does not fit."""
        messages = [
            *b.messages,
            {"role": "assistant", "content": action},
            {"role": self.opt.observation_role, "content": obs},
        ]
        text = _render(self.tok, messages)
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
        ids = _encode_exact(self.tok, suffix, b.turn)
        if len(b.held_ids) + len(ids) >= self.opt.max_context:
            return False
        b.node = await _tree(self.tree.append, b.node, ids, None, False, -1)
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
                partial = _partial({"partial_score": await _in_thread(scorer)})
            except InfrastructureFailure as e:  # the cut branch cannot be scored: no outcome
                status, failure = "aborted", e
        info = {"turns": b.turn, "rewards": b.rewards}
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
            leaf = await _tree_durable(
                self.tree.finish, b.node, reward, partial_score=partial, status=status, info=info, durable=False
            )
        except DuplicateLeafError as e:  # an identical path was already stored: it is that leaf
            leaf = e.leaf_id
        self.emit("finish", status=status, reward=reward, partial_score=partial, turns=b.turn)
        if b.env is not None and id(b.env) not in self._closed:
            if failure is None:
                await _in_thread(self.close_env, b.env)
            else:  # its sandbox may be gone already: a failing close must not hide the abort
                try:
                    await _in_thread(self.close_env, b.env)
                except Exception as e:  # noqa: BLE001 - logged; the leaf is stored
                    log.warning("closing the env of an aborted branch failed: %r", e)
        return LeafResult(leaf, reward, status, partial, b.turn, b.policy_tokens, list(b.rewards), info, b.sampled)

    # ------------------------------------------------------------------ branching

    def should_branch(self, b: _Branch) -> bool:
        """Whether ``b`` forks now: at a turn of ``branch_at`` it has not forked at, and (entropy
        policy) only when its last action's mean surprisal reaches ``branch_entropy``."""
        if self.opt.branch_factor < 2 or b.turn not in self.opt.branch_at or b.turn in b.branched:
            return False
        if self.opt.branch_policy == "entropy" and b.turn > 0 and b.surprisal < self.opt.branch_entropy:
            b.branched.add(b.turn)  # decided: this path goes on alone
            return False
        return True

    async def branch(self, b: _Branch) -> list[LeafResult]:
        """Fork ``b`` into ``branch_factor`` continuations. An engine with ``branch(i)`` (the
        seeded view) gives branch ``i`` its own seed stream, so the tokens do not depend on how
        the branches interleave."""
        b.branched.add(b.turn)
        parent_engine = b.engine or self.engine
        per_branch = getattr(parent_engine, "branch", None)
        clones = [b]
        for _ in range(self.opt.branch_factor - 1):
            try:
                env = await self.fork_env(b)
            except InfrastructureFailure as e:  # no env for a continuation: the branch ends here
                for c in clones[1:]:
                    with contextlib.suppress(Exception):
                        await _in_thread(self.close_env, c.env)
                if b.turn == 0 and not b.actions:  # nothing sampled yet: as a failed reset
                    raise
                return [await self.finish(b, "aborted", failure=e)]
            clone = copy.copy(b)
            clone.env = env
            clone.sampled = 0  # the shared part was sampled once, by b
            clone.messages = list(b.messages)
            clone.held_ids = list(b.held_ids)
            clone.rewards = list(b.rewards)
            clone.actions = list(b.actions)
            clone.observations = list(b.observations)
            clone.info = dict(b.info)
            clone.branched = set(b.branched)
            clone.turn_starts = list(b.turn_starts)
            clone.demo_spans = [list(s) for s in b.demo_spans]
            clones.append(clone)
        if callable(per_branch):
            for i, c in enumerate(clones):
                c.engine = per_branch(i)
        share = b.budget / len(clones)  # the remaining tree budget, split equally
        for c in clones:
            c.budget = share
        results = await asyncio.gather(*(self.run(c) for c in clones))
        return [leaf for leaves in results for leaf in leaves]

    async def fork_env(self, b: _Branch) -> Any:
        fork = getattr(b.env.unwrapped, "fork", None) or getattr(b.env, "fork", None)
        if callable(fork):
            return await _in_thread(fork)
        if self.make_env is None:
            raise ValueError("branching needs env.fork() or a make_env factory to replay the episode")
        return await _in_thread(self._replay, b)

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
                f"env {_env_name(env)}: replay with seed {self.seed} gave a different first observation; "
                "implement fork() or make reset deterministic in its seed"
            )
        for t, action in enumerate(b.actions):
            obs, *_ = env.step(action)
            if obs != b.observations[t + 1]:
                raise ForkMismatchError(
                    f"env {_env_name(env)}: replaying turn {t} gave a different observation; "
                    "implement fork() or make the env deterministic in its seed"
                )
        return env


def reset_args(task: dict[str, Any], seed: int | None) -> tuple[int | None, dict[str, Any] | None]:
    """How to reset for ``task``: ``(seed, options["task"])``.

    A task whose metadata holds ``reset_seed`` (the ``env-reset`` source) is the env's own choice:
    ``reset(seed=reset_seed)`` with no task option. Any other task is handed over whole, with ``seed``.
    """
    meta = task.get("metadata") or {}
    if "reset_seed" in meta:
        return int(meta["reset_seed"]), None
    return seed, dict(task)


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
    runner = _Runner(
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
        return await runner.start(env)
    except BaseException:
        try:
            runner.close_env(runner.env if runner.env is not None else env)
        except Exception as e:  # noqa: BLE001 - the episode's own error is the one to raise
            log.warning("closing the env of a failed episode failed: %r", e)
        raise


async def run_episodes(
    make_env: Callable[[], Any],
    engine: Engine | None,
    tokenizer: Any,
    tree: Any,
    n: int,
    options: RolloutOptions | None = None,
    *,
    concurrency: int = 64,
    seeds: Sequence[int] | None = None,
    tasks: Sequence[Any] | None = None,
    on_done: Callable[[EpisodeResult], None] | None = None,
    actor: Actor | None = None,
) -> list[EpisodeResult]:
    """Run ``n`` episodes, at most ``concurrency`` at once, against one engine; results in order.

    ``seeds[i]`` / ``tasks[i]`` (when given) seed and choose the task of episode ``i``;
    ``on_done`` is called as each episode finishes (progress bars); ``actor`` as in :func:`run_episode`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    for name, seq in (("seeds", seeds), ("tasks", tasks)):
        if seq is not None and len(seq) < n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} episodes")
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> EpisodeResult:
        async with gate:
            res = await run_episode(
                None,
                engine,
                tokenizer,
                tree,
                options,
                seed=seeds[i] if seeds is not None else None,
                task=tasks[i] if tasks is not None else None,
                make_env=make_env,
                actor=actor,
            )
            if on_done is not None:
                on_done(res)
            return res

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def run_episodes_sync(*args: Any, **kwargs: Any) -> list[EpisodeResult]:
    """:func:`run_episodes` from synchronous code (starts and closes its own event loop)."""
    return asyncio.run(run_episodes(*args, **kwargs))
