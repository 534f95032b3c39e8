"""Gymnasium environments for multi-turn LLM agents.

``import envs`` registers every built-in id (the table lives in :mod:`fr_agents.registry`, as
strings, so that ``import fr_agents`` can register them without importing this package).
"""

from fr_agents.registry import register_builtin_envs

register_builtin_envs()
