"""One graded HumanEval-v0 attempt, as the reward-hack tests make them (shared by the hack files)."""

from __future__ import annotations

import textwrap
from typing import Any

import gymnasium


def attempt(backend: str, task: dict[str, Any], reply: str, **kw: Any) -> tuple[float, dict[str, Any]]:
    """Reset HumanEval-v0 on ``task`` (sandbox ``backend``), send ``reply``; its reward and info."""
    env = gymnasium.make("fr_agents/HumanEval-v0", backend=backend, **{"timeout": 10.0, **kw})
    try:
        env.reset(options={"task": task})
        _obs, reward, _term, _trunc, info = env.step(reply)
        return float(reward), info
    finally:
        env.close()


def body(code: str) -> str:
    """A completion (function body) from dedented code."""
    return textwrap.indent(textwrap.dedent(code).strip("\n"), "    ") + "\n"
