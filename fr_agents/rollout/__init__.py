"""The rollout: token-truthful multi-turn episodes of a text env, stored in a trajectory tree.

An episode alternates the engine's reply (kept exactly as sampled, with its behaviour log-probs and
per-token policy versions) and the env's observation (templated onto the held tokens); every
segment is in the tree as soon as it exists, and an episode may fork into branches that share
their prefix there (:mod:`.episode` shows it token by token).

The modules, one concern each (each module's docstring says more):

* :mod:`.options`  — :class:`RolloutOptions` (how episodes run) and the results,
  :class:`EpisodeResult` / :class:`LeafResult`;
* :mod:`.episode`  — :func:`run_episode`: one episode as a state machine over its branches (limits,
  infrastructure failures);
* :mod:`.branching` — where and how an episode forks (before a reply, or inside it at its most
  uncertain tokens), the tree token budget, env forks and replays;
* :mod:`.env_thread` — the thread pool every env call runs on, and how messages name an env;
* :mod:`.batch`    — :func:`run_episodes` (many at once, one engine), :func:`reset_args`;
* :mod:`.encoding` — :func:`encode_prompt`, the one prompt encoder, the round-trip check
  (:class:`TokenDriftError`), through the fast tokenizer's backend where that is exact, and
  :func:`default_stop_ids`, the tokens that end a turn;
* :mod:`.experts`  — :func:`expert_actor`: scripted replies from the env's own expert;
* :mod:`.writer`   — the tree-writer thread: the episodes' store writes, group-committed.

Names. An *episode* is one reset of an env and everything sampled from it, all branches included
(:func:`run_episode` runs one; its state machine is ``episode._Episode``, one ``_Branch`` per
conversation). A *branch* is one (possibly forked) conversation; a *leaf* is where a branch
finished in the tree. A *runner* drives episodes from outside, through :func:`run_episode`:
the trainer's :class:`trainer.episodes.EpisodeRunner` (a training run's scheduled episodes, with
retries and the ledger) and :mod:`fr_agents.eval.runner` (a bench's samples). Neither lives here,
and nothing here is called a runner.
"""

from fr_agents.rollout.batch import reset_args, run_episodes, run_episodes_sync
from fr_agents.rollout.branching import ForkMismatchError
from fr_agents.rollout.encoding import (
    TokenDriftError,
    default_stop_ids,
    encode_prompt,
    example_turns,
    prompt_messages,
)
from fr_agents.rollout.episode import ObservationTypeError, run_episode
from fr_agents.rollout.experts import NoExpertError, expert_actor, has_expert, require_expert
from fr_agents.rollout.options import Actor, EpisodeResult, EventFn, LeafResult, RolloutOptions

__all__ = [
    "Actor",
    "EpisodeResult",
    "EventFn",
    "ForkMismatchError",
    "LeafResult",
    "NoExpertError",
    "ObservationTypeError",
    "RolloutOptions",
    "TokenDriftError",
    "default_stop_ids",
    "encode_prompt",
    "example_turns",
    "expert_actor",
    "has_expert",
    "prompt_messages",
    "require_expert",
    "reset_args",
    "run_episode",
    "run_episodes",
    "run_episodes_sync",
]
