"""Resolve ``"module:attr"`` strings, the project's one late-binding mechanism.

Gymnasium names env entry points this way; the config does the same for task providers and eval
benches, so a package lower in the data flow (``trainer``) can use one higher up (``envs``)
without importing it, and users can point any of these at their own code.
"""

from __future__ import annotations

import importlib
from typing import Any

from fr_agents.config import ConfigError


def load_object(spec: str, *, key: str) -> Any:
    """Import ``module`` and return ``module.attr`` for ``spec = "module:attr"``.

    Errors are :class:`ConfigError` naming the config ``key`` the spec came from.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}: expected 'module:attr', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key}: cannot import module {module_name!r} ({e})") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
