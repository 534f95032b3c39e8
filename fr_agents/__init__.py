"""fr-agents: train LLM agents with asynchronous FlashREINFORCE on real multi-turn environments.

Importing the package registers the built-in gymnasium ids (``fr_agents/MathVerifier-v0`` and
friends) through string entry points, so it stays cheap.
"""

from fr_agents.registry import register_builtin_envs

__version__ = "0.1.0"

register_builtin_envs()
