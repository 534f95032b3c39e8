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


def _module_imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports anywhere: at the top, inside functions or
    under ``TYPE_CHECKING`` (a lazy import is still a dependency)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"{package}.{node.module}"
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return {m for m in found if m.startswith(package + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


@pytest.mark.parametrize("package", ["fr_agents.tree"])
def test_no_import_cycle_inside(package: str) -> None:
    """The modules of ``package`` import each other along one direction only (the package's
    ``__init__`` re-exports and is left out: it is the front door, not a part)."""
    folder = ROOT.joinpath(*package.split("."))
    modules = {f"{package}.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    graph = {name: _module_imports(path, package) & set(modules) for name, path in modules.items()}
    assert not _cycles(graph), f"import cycles in {package}: {_cycles(graph)}"


def _defined_functions(tree: ast.AST) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _function_like(value: ast.expr, defs: set[str]) -> bool:
    """A lambda, a function or method defined in the module (``counted``, ``self._grow_step``), or
    a ``partial``/``MethodType`` of one: what reassigning a method puts in its place."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name | ast.Attribute):
        return (value.id if isinstance(value, ast.Name) else value.attr) in defs
    if isinstance(value, ast.Call):
        fn = value.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        return name in ("partial", "MethodType")
    return False


def test_no_method_reassignment_on_another_object_in_trainer() -> None:
    """Extension by hooks and wrappers: nothing in ``trainer/`` puts a function onto another
    object's attribute (``self.runner.run = counted``, ``learner.step = step``,
    ``setattr(learner, "step", fn)``). Hooks are handed over when the object is built; one's
    own attributes (``self.x = ...``) are one's own business."""
    bad = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs = _defined_functions(tree)
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                pairs = [(node.target, node.value)]
            else:
                pairs = []
            for t, value in pairs:
                own = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")
                if isinstance(t, ast.Attribute) and not own and _function_like(value, defs):
                    bad.append(f"{where}:{t.lineno} puts a function on .{t.attr} of another object")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and len(node.args) == 3
                and _function_like(node.args[2], defs)
            ):
                bad.append(f"{where}:{node.lineno} setattr() puts a function on another object")
    assert not bad, "\n".join(bad)
