"""Hooks: how a run is extended without touching its parts' methods.

A :class:`~trainer.loop.Trainer` takes a :class:`TrainerHooks` object, or a list of them, and calls
them at fixed points; every hook does nothing by default, so a subclass overrides only what it
needs. A hooks object extends a plain ``Trainer``: nothing subclasses the trainer itself. A list
composes (:class:`HookList`), as gymnasium's wrappers and TRL's callbacks do: each hook runs in list
order, ``engine`` wraps the engine the previous hook returned, ``around_step`` nests (the first hook
outermost), and ``run_ended`` runs in reverse order, every one of them even when one raises. The
elastic runtime (:class:`~trainer.elastic.runtime.ElasticHooks`) is the example: it hands the
episode runner an :class:`~trainer.elastic.pools.ElasticPool` instead of the plain engine
(:meth:`engine`), counts finished episodes (:meth:`episode_done`), sizes each learner step to its
train pool (:meth:`around_step`, :meth:`before_micro_batch`) and watches the learner wait
(:meth:`waiting`). Nobody reassigns a method of another object. :meth:`engine` and
:meth:`episode_done` act inside the rollout, so they need it in the learner's process
(``trainer.backend=local``); the trainer refuses them with ``process``.

When each hook runs::

    build:   engine(base, tokenizer)            once, when the rollout side is built
    start:   run_started(trainer)               the parts exist, before the warm start
             rollout_started(rollout)           the rollout (thread or process) runs
    loop:    waiting(True) ... waiting(False)   the learner waits for batch k
             around_step(step)                  wraps one learner step (call step() once)
             before_micro_batch()               inside the step, before each micro-batch
             episode_done(outcome)              rollout thread, each finished episode
    end:     run_ended()                        always, also after an error
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from fr_agents.policy.base import Engine
    from trainer.episodes import EpisodeOutcome
    from trainer.loop import Trainer
    from trainer.rollout_thread import Rollout

ROLLOUT_HOOKS = ("engine", "episode_done")
"""The hooks that act inside the rollout, so they need it in the learner's process."""


class TrainerHooks:
    """Every hook of a run, each a no-op (see the module docstring)."""

    def engine(self, base: Engine, tokenizer: PreTrainedTokenizerBase) -> Engine:
        """The engine the episode runner samples with, given the one ``rollout.engine`` built."""
        return base

    def run_started(self, trainer: Trainer) -> None:
        """The run's parts are built (``trainer.learner_side``, ``trainer.rollout_side``; the parts
        read most also as ``trainer.learner``, ``trainer.board``, ``trainer.runner``, ``trainer.model``)."""

    def rollout_started(self, thread: Rollout) -> None:
        """The rollout (thread or process) started (``thread.next_batch``: the batch it works on)."""

    def waiting(self, waiting: bool) -> None:
        """The learner starts (True) or stops (False) waiting for its next batch."""

    def around_step(self, step: Callable[[], dict[str, float]]) -> dict[str, float]:
        """One learner step: call ``step()`` exactly once and return its stats."""
        return step()

    def before_micro_batch(self) -> None:
        """Inside a learner step, before each micro-batch (the Learner calls it)."""

    def episode_done(self, outcome: EpisodeOutcome) -> None:
        """The rollout thread finished and recorded one episode (its ``EpisodeOutcome``)."""

    def run_ended(self) -> None:
        """The run is over (also after an error): stop what the hooks started."""


def acts_inside_rollout(hooks: TrainerHooks) -> list[str]:
    """``Class.hook`` for each of :data:`ROLLOUT_HOOKS` that ``hooks`` (or a member of a
    :class:`HookList`) overrides."""
    members = hooks.hooks if isinstance(hooks, HookList) else [hooks]
    return [
        f"{type(h).__name__}.{name}"
        for h in members
        for name in ROLLOUT_HOOKS
        if getattr(type(h), name) is not getattr(TrainerHooks, name)
    ]


def refuse_rollout_hooks(hooks: TrainerHooks, backend: str) -> None:
    """Raise ConfigError when ``hooks`` act inside the rollout and ``backend`` runs it in a child
    process (``trainer.backend=process``)."""
    from fr_agents.config import ConfigError

    if backend == "process" and (inside := acts_inside_rollout(hooks)):
        raise ConfigError(
            f"trainer.backend: the hooks {'/'.join(inside)} act inside the rollout, "
            "which trainer.backend=process runs in a child process; use trainer.backend=local"
        )


class HookList(TrainerHooks):
    """Several hooks as one (see the module docstring for the order)."""

    def __init__(self, hooks: Sequence[TrainerHooks]) -> None:
        self.hooks = list(hooks)

    def engine(self, base: Engine, tokenizer: PreTrainedTokenizerBase) -> Engine:
        for h in self.hooks:
            base = h.engine(base, tokenizer)
        return base

    def run_started(self, trainer: Trainer) -> None:
        for h in self.hooks:
            h.run_started(trainer)

    def rollout_started(self, thread: Rollout) -> None:
        for h in self.hooks:
            h.rollout_started(thread)

    def waiting(self, waiting: bool) -> None:
        for h in self.hooks:
            h.waiting(waiting)

    def around_step(self, step: Callable[[], dict[str, float]]) -> dict[str, float]:
        wrapped = step
        for h in reversed(self.hooks):  # the first hook ends up outermost
            wrapped = (lambda hook, inner: lambda: hook.around_step(inner))(h, wrapped)
        return wrapped()

    def before_micro_batch(self) -> None:
        for h in self.hooks:
            h.before_micro_batch()

    def episode_done(self, outcome: EpisodeOutcome) -> None:
        for h in self.hooks:
            h.episode_done(outcome)

    def run_ended(self) -> None:
        errors = []
        for h in reversed(self.hooks):
            try:
                h.run_ended()
            except Exception as e:  # the others still stop what they started
                errors.append(e)
        if errors:
            raise errors[0]


def as_hooks(hooks: TrainerHooks | Sequence[TrainerHooks] | None) -> TrainerHooks:
    """One hooks object from what a Trainer was given: none, one, or a list (a :class:`HookList`)."""
    if hooks is None:
        return TrainerHooks()
    if isinstance(hooks, TrainerHooks):
        return hooks
    return HookList(hooks)
