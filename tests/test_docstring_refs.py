"""Each package module's own docstring names only things (and files) that exist.

A module docstring is where a newcomer starts, and where a merge or a rename leaves a dead name
behind. Every Sphinx-style reference in one (``:func:``, ``:class:``, ``:meth:``, ``:mod:``,
``:data:``, ``:attr:``, ``:exc:``) to this project's code must resolve, read statically: a bare
name against the module's own top-level names (its definitions and imports), a dotted one against
the module file it names, then the class and member inside it. References to other libraries
(``torch.…``, ``gymnasium.…``) are not checked."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fr_agents", "trainer", "envs", "tools_sandbox")
PATH = re.compile(
    r"(?<![\w/])((?:fr_agents|trainer|envs|tools_sandbox|benchmarks|docs|scripts|configs|tests)"
    r"/[\w/.-]+\.(?:py|md|sh|yaml))"
)
ROLE = re.compile(r":(func|class|meth|mod|data|attr|exc):`~?([A-Za-z_][\w.]*)(?:\(\))?`")


def _module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@cache
def _names(path: Path) -> dict[str, ast.AST | None]:
    """Top-level names of a module file: definitions, assignments, imports (imported names map to None)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, ast.AST | None] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = node
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    out[(a.asname or a.name).split(".")[0]] = None
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "orelse", []))

    visit(tree.body)
    return out


@cache
def _members(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            names.add(n.attr)
    return names


def _resolves(path: Path, parts: list[str]) -> bool:
    """Do ``parts`` (a name, then members) exist in the module file ``path``?"""
    names = _names(path)
    if parts[0] not in names:
        return False
    node = names[parts[0]]
    if len(parts) == 1 or node is None:
        return True  # an imported name's members are its own module's business
    if isinstance(node, ast.ClassDef):
        return len(parts) == 2 and parts[1] in _members(node)
    return False


def _neighbours(here: Path) -> list[Path]:
    """Where a bare name may live: the module itself; a package's ``__init__`` also speaks of its
    submodules' names (``:mod:`.engines` -- :func:`open_engine```)."""
    if here.name == "__init__.py":
        return [here, *sorted(p for p in here.parent.glob("*.py") if p != here)]
    return [here]


def _bare(role: str, name: str, here: Path) -> bool:
    for path in _neighbours(here):
        if _resolves(path, [name]):
            return True
        if role in ("meth", "attr"):  # a member of a class the docstring is speaking of
            classes = [n for n in _names(path).values() if isinstance(n, ast.ClassDef)]
            if any(name in _members(c) for c in classes):
                return True
    return False


def _check(ref: str, here: Path, role: str = "func") -> bool:
    parts = ref.split(".")
    if len(parts) == 1:
        return _bare(role, ref, here)
    if parts[0] not in PACKAGES:
        return parts[0] not in _names(here) or _resolves(here, parts)
    for cut in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:cut]))
        if path is not None:
            return cut == len(parts) or _resolves(path, parts[cut:])
    return False


def _module_docstrings() -> list[tuple[Path, str]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
            if doc:
                out.append((path, doc))
    return out


def test_module_docstrings_name_only_what_exists() -> None:
    dead = []
    for path, doc in _module_docstrings():
        for role, ref in ROLE.findall(doc):
            bare_external = "." not in ref and ref not in _names(path) and role in ("mod",)
            if bare_external:
                continue
            if not _check(ref, path, role):
                dead.append(f"{path.relative_to(ROOT)}: :{role}:`{ref}`")
    assert not dead, "module docstrings name what does not exist:\n" + "\n".join(dead)


def test_module_docstrings_name_only_files_that_exist() -> None:
    """A path a module docstring gives (``trainer/batches.py``, ``docs/DESIGN.md``) is a file here."""
    dead = [
        f"{path.relative_to(ROOT)}: {ref}"
        for path, doc in _module_docstrings()
        for ref in PATH.findall(doc)
        if not (ROOT / ref).exists()
    ]
    assert not dead, "module docstrings name files that do not exist:\n" + "\n".join(dead)


def test_the_check_catches_a_dead_name(tmp_path: Path) -> None:
    """The resolver is not vacuous: names that do exist pass, a removed module and a missing member fail."""
    here = ROOT / "trainer" / "loop.py"
    assert _check("Trainer", here) and _check("trainer.loop.main_train", here)
    assert _check("fr_agents.tree.store.TrajectoryTree.append", here)
    assert not _check("trainer.schedule.EpisodeSchedule", here)
    assert not _check("fr_agents.tree.store.TrajectoryTree.no_such_method", here)
    assert not _check("NoSuchThing", here)
    assert _check("around_step", here, "meth") and not _check("no_such_hook", here, "meth")
