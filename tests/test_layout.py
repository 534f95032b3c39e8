"""The layout rules of docs/DESIGN.md, checked on the source: no import climbs back up the data flow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> packages of ours it must not import (DESIGN.md "Top-level layout")
FORBIDDEN = {
    "fr_agents": {"envs", "tools_sandbox", "trainer"},  # except fr_agents/cli.py
    "envs": {"trainer"},
    "tools_sandbox": {"fr_agents", "envs", "trainer"},
    "trainer": {"envs", "tools_sandbox"},
}
EXEMPT = {ROOT / "fr_agents" / "cli.py"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_climbs_the_data_flow(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path in EXEMPT:
            continue
        for line, top in _imports(path):
            if top in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not bad, "\n".join(bad)
