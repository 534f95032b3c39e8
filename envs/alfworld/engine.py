"""ALFWorld's own TextWorld engine, assembled the way ``alfworld`` does it.

A ``game.tw-pddl`` file (JSON: ``pddl_domain``, ``grammar``, ``pddl_problem``, ``solvable``,
``walkthrough``) is played by ``textworld.envs.PddlEnv`` (Fast Downward applies the PDDL actions and
lists the applicable ones) wrapped by ``AlfredDemangler`` (``apple_bar_7_bar_1`` -> ``apple 1``) and
``AlfredInfos`` from ``alfworld.agents.environment.alfred_tw_env``. Nothing here re-implements game
logic: this module only builds that stack and exposes the planner and the fact list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def data_files() -> tuple[str, str]:
    """The PDDL domain and the TextWorld grammar shipped in the ``alfworld`` wheel."""
    import alfworld

    root = Path(alfworld.__file__).parent / "data"
    return (root / "alfred.pddl").read_text(), (root / "alfred.twl2").read_text()


def make_textworld_env(facts: bool = False) -> Any:
    """PddlEnv + AlfredDemangler + AlfredInfos, requesting admissible commands and ``won``."""
    try:
        import fast_downward  # noqa: F401
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
    except ImportError as e:
        raise ImportError(
            f"ALFWorld needs alfworld, textworld and fast-downward-textworld ({e}); "
            "run: bash scripts/install_alfworld.sh"
        ) from e

    infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=facts, extras=["gamefile"])
    env = PddlEnv(infos)
    env = AlfredDemangler(env, shuffle=False)
    return AlfredInfos(env)


def pddl_env(tw_env: Any) -> Any:
    """The innermost ``PddlEnv`` of a wrapper stack."""
    env = tw_env
    while hasattr(env, "_wrapped_env") and env._wrapped_env is not None:
        env = env._wrapped_env
    return env


def plan(tw_env: Any) -> list[str]:
    """Fast Downward's plan from the current state, as game commands ([] when none exists).

    This is what ``PddlEnv`` computes for ``EnvInfos(policy_commands=True)`` (and what ALFWorld's
    ``AlfredExpert(expert_type="planner")`` returns); calling it on demand avoids re-planning after
    every step.
    """
    inner = pddl_env(tw_env)
    return list(inner._pddl_state.replan(inner._entity_infos))


def task_types() -> tuple[str, ...]:
    from envs.alfworld.sampling import TASK_TYPES

    return TASK_TYPES

