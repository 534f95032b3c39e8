"""ALFWorld on ALFWorld's own TextWorld engine (``fr_agents/ALFWorld-v0``), with offline game generation.

Modules: :mod:`~envs.alfworld.env` (the gymnasium env), :mod:`~envs.alfworld.expert` (walkthrough /
planner expert), :mod:`~envs.alfworld.generate` (offline games), :mod:`~envs.alfworld.scenes`,
:mod:`~envs.alfworld.sampling`, :mod:`~envs.alfworld.pddl_problem` (how games are made),
:mod:`~envs.alfworld.engine` (the PddlEnv + Alfred wrappers stack), :mod:`~envs.alfworld.progress`
(partial scores), :mod:`~envs.alfworld.sources` (where games come from).

Nothing is imported here eagerly: ``alfworld`` and ``textworld`` are an optional extra
(``bash scripts/install_alfworld.sh``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALFWorldEnv", "ExpertAgent", "generate"]


def __getattr__(name: str) -> Any:
    if name == "ALFWorldEnv":
        from envs.alfworld.env import ALFWorldEnv

        return ALFWorldEnv
    if name == "ExpertAgent":
        from envs.alfworld.expert import ExpertAgent

        return ExpertAgent
    if name == "generate":
        from envs.alfworld.generate import generate

        return generate
    raise AttributeError(name)
