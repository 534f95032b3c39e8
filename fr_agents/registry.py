"""The table of built-in environment ids and their (string) entry points.

Entry points are strings, so registering costs no import of ``envs``: ``import fr_agents`` and
``import envs`` both call :func:`register_builtin_envs`, and gymnasium imports the env module only
when ``gymnasium.make`` is called.
"""

from __future__ import annotations

import gymnasium

# id -> (entry point, one-line description). Add an env here when its module lands.
BUILTIN_ENVS: dict[str, tuple[str, str]] = {
    "fr_agents/ALFWorld-v0": (
        "envs.alfworld.env:ALFWorldEnv",
        "ALFWorld household tasks on ALFWorld's TextWorld engine (official or offline-generated games)",
    ),
    "fr_agents/HumanEval-v0": (
        "envs.humaneval:HumanEvalEnv",
        "a HumanEval problem; reward 1 when the completion passes its tests (run in tools_sandbox)",
    ),
    "fr_agents/MathVerifier-v0": (
        "envs.math_verifier:MathVerifierEnv",
        "math problem, reward 1 when the last \\boxed{} answer verifies (math-verify, process pool)",
    ),
    "fr_agents/RepoCoding-v0": (
        "envs.repo_coding.env:RepoCodingEnv",
        "fix an injected bug in a real repo in a sandbox; graded on hidden tests (SWE-bench fields)",
    ),
    "fr_agents/PythonTool-v0": (
        "envs.python_tool:PythonToolEnv",
        "math with a persistent sandboxed Python tool (Hermes <tool_call>), graded like MathVerifier",
    ),
}


def register_builtin_envs() -> None:
    """Register every built-in id with gymnasium (idempotent)."""
    for env_id, (entry_point, _doc) in BUILTIN_ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, disable_env_checker=True)
