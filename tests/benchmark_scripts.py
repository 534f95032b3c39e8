"""Load a script of ``benchmarks/`` as a module, so tests can call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, as_name: str | None = None) -> ModuleType:
    """``benchmarks/<name>.py`` as a fresh module named ``as_name`` (default ``name``), registered in
    ``sys.modules``, where a dataclass of the script looks its module up. Pass ``as_name`` when ``name``
    is also an installed package's name (``alfworld``): registering the script under it would hand the
    script to every later ``import alfworld`` of the test session."""
    as_name = as_name or name
    spec = importlib.util.spec_from_file_location(as_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[as_name] = module
    spec.loader.exec_module(module)
    return module
