"""Rollout defaults: the one place ``rollout``, ``play``, ``eval`` and training take them from.

A preset or a flag overrides any of them; these are what applies when nothing does.
:class:`fr_agents.rollout.RolloutOptions`, the training config's ``rollout.*`` fields
(:mod:`fr_agents.config`) and the CLI flags of ``fr-agents rollout``/``play``/``eval`` read them.
(An eval bench may carry its own, task-sized settings: those win over these for that bench.)
"""

from __future__ import annotations

TEMPERATURE = 1.0  # sampling temperature; behaviour log-probs are taken after it
HELD_OUT_TEMPERATURE = 0.0  # a run's held-out figures are greedy; `fr-agents eval RUN` at k 1 plays them so
MAX_NEW_TOKENS = 64  # tokens the policy may sample per turn
MAX_CONTEXT = 2048  # prompt + reply tokens an episode may hold; longer ones end truncated
MAX_TURNS = 8  # turns per episode of `rollout`/`play` (training: env.max_turns)
