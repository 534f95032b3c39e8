"""AST-located bug injection, SWE-smith style.

A *mutation* is a small, local edit to one function of a source file that keeps the file valid
Python: a swapped operator, an off-by-one constant, a removed ``if`` branch, a changed constant or
two swapped call arguments. The AST only *locates* the edit; the edit itself is spliced into the
original text, so the rest of the file (comments, formatting) is untouched and the gold patch (the
reverse edit) is a one-hunk diff.

:func:`find_mutations` lists every candidate in a file in a fixed order; the task builder shuffles
that list with its seed and keeps the candidates that break at least one test.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Operator swaps: (ast type) -> (replacement ast type). The source token of each type:
_BINOP_SWAP: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
_BINOP_TOKEN: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
}
_CMP_SWAP: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
# Regexes that find each comparison token in the text between two operands.
_CMP_RE: dict[type, str] = {
    ast.Lt: r"<(?![<=])",
    ast.LtE: r"<=",
    ast.Gt: r"(?<![>-])>(?![>=])",
    ast.GtE: r">=",
    ast.Eq: r"==",
    ast.NotEq: r"!=",
    ast.In: r"(?<![\w])in(?![\w])",
    ast.NotIn: r"(?<![\w])not\s+in(?![\w])",
    ast.Is: r"(?<![\w])is(?![\w])(?!\s+not(?![\w]))",
    ast.IsNot: r"(?<![\w])is\s+not(?![\w])",
}
_CMP_TOKEN: dict[type, str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}

KINDS = ("swap_operator", "off_by_one", "remove_branch", "change_constant", "swap_arguments")


@dataclass(frozen=True)
class Mutation:
    """One candidate edit of ``source``: replace bytes ``[start, end)`` by ``replacement``.

    ``kind`` is one of :data:`KINDS`; ``line`` is the 1-based line of the edit and ``function``
    the enclosing function, both for reports only (never shown to the agent).
    """

    kind: str
    line: int
    function: str
    start: int
    end: int
    replacement: str
    note: str

    @property
    def key(self) -> str:
        """A stable identity of this candidate inside its file."""
        return f"{self.kind}:{self.line}:{self.start}:{self.end}"

    def apply(self, source: str) -> str:
        """The mutated text (``source`` must be the text the mutation was found in)."""
        raw = source.encode("utf-8")
        return (raw[: self.start] + self.replacement.encode("utf-8") + raw[self.end :]).decode("utf-8")


class _Offsets:
    """Converts the AST's (line, UTF-8 column) positions to byte offsets in the file."""

    def __init__(self, source: str) -> None:
        self.raw = source.encode("utf-8")
        self.starts = [0]
        for line in self.raw.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.at(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.at(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def text(self, start: int, end: int) -> str:
        return self.raw[start:end].decode("utf-8")


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            ids.add(id(first.value))
    return ids


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``fn``'s body, not descending into nested functions/classes (they are visited on
    their own) and skipping decorators and defaults."""
    stack = list(reversed(fn.body))  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _swap_token(
    off: _Offsets, left: ast.AST, right: ast.AST, pattern: str, new: str
) -> tuple[int, int] | None:
    """Byte span of the single operator token matched by ``pattern`` between two operands."""
    gap_start = off.at(left.end_lineno, left.end_col_offset)  # type: ignore[attr-defined]
    gap_end = off.at(right.lineno, right.col_offset)  # type: ignore[attr-defined]
    gap = off.text(gap_start, gap_end)
    if "#" in gap:
        return None
    hits = list(re.finditer(pattern, gap))
    if len(hits) != 1:
        return None
    m = hits[0]
    return gap_start + len(gap[: m.start()].encode()), gap_start + len(gap[: m.end()].encode())


def _line_is_whole(off: _Offsets, node: ast.stmt) -> bool:
    """True when ``node`` starts its first line (after indentation) and ends its last line."""
    first = off.text(off.starts[node.lineno - 1], off.at(node.lineno, node.col_offset))
    last_end = off.starts[node.end_lineno] if node.end_lineno < len(off.starts) else len(off.raw)  # type: ignore[operator]
    rest = off.text(off.at(node.end_lineno, node.end_col_offset), last_end)  # type: ignore[arg-type]
    return first.strip() == "" and rest.strip() == ""


def find_mutations(source: str) -> list[Mutation]:
    """Every candidate mutation inside the functions of ``source``, in file order.

    Module-level code (constant tables, imports) is never mutated: bugs live in logic.
    """
    tree = ast.parse(source)
    off = _Offsets(source)
    docstrings = _docstring_nodes(tree)
    out: list[Mutation] = []
    seen: set[tuple[int, int, str]] = set()

    def add(kind: str, node: ast.AST, fn: str, start: int, end: int, new: str, note: str) -> None:
        if (start, end, new) in seen or off.text(start, end) == new:
            return
        seen.add((start, end, new))
        out.append(Mutation(kind, getattr(node, "lineno", 0), fn, start, end, new, note))

    for fn in _functions(tree):
        name = fn.name
        for node in _own_nodes(fn):
            if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
                new_op = _BINOP_SWAP[type(node.op)]
                tok = re.escape(_BINOP_TOKEN[type(node.op)]) + r"(?![=/*<>])"
                if type(node.op) is ast.Mult:
                    tok = r"(?<!\*)\*(?![*=])"
                elif type(node.op) in (ast.Add, ast.Sub):
                    tok = rf"(?<![eE\d.]){re.escape(_BINOP_TOKEN[type(node.op)])}(?!=)"
                span = _swap_token(off, node.left, node.right, tok, _BINOP_TOKEN[new_op])
                if span:
                    add("swap_operator", node, name, *span, _BINOP_TOKEN[new_op], "binary operator")
            elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
                op = type(node.ops[0])
                span = _swap_token(off, node.left, node.comparators[0], _CMP_RE[op], "")
                if span:
                    add("swap_operator", node, name, *span, _CMP_TOKEN[_CMP_SWAP[op]], "comparison")
            elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
                old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
                span = _swap_token(off, node.values[0], node.values[1], rf"(?<![\w]){old}(?![\w])", new)
                if span:
                    add("swap_operator", node, name, *span, new, "boolean operator")
            elif isinstance(node, ast.Constant) and id(node) not in docstrings:
                _constant(node, name, off, add)
            elif isinstance(node, ast.If) and not node.orelse and _line_is_whole(off, node):
                line_text = off.text(off.starts[node.lineno - 1], off.starts[node.lineno])
                if line_text.lstrip().startswith("elif"):
                    continue
                start, end = off.span(node)
                add("remove_branch", node, name, start, end, "pass", "if without else removed")
            elif isinstance(node, ast.Call) and len(node.args) >= 2:
                a, b = node.args[0], node.args[1]
                if any(isinstance(x, ast.Starred) for x in (a, b)):
                    continue
                sa, ea = off.span(a)
                sb, eb = off.span(b)
                ta, tb = off.text(sa, ea), off.text(sb, eb)
                if ta != tb:
                    add(
                        "swap_arguments",
                        node,
                        name,
                        sa,
                        eb,
                        tb + off.text(ea, sb) + ta,
                        "first two arguments",
                    )
    checked: list[Mutation] = []
    for m in out:
        try:
            new_tree = ast.parse(m.apply(source))
        except SyntaxError:
            continue
        if ast.dump(new_tree) != ast.dump(tree):
            checked.append(m)
    return checked


def _constant(node: ast.Constant, fn: str, off: _Offsets, add) -> None:  # noqa: ANN001
    start, end = off.span(node)
    value = node.value
    if isinstance(value, bool):
        add("change_constant", node, fn, start, end, str(not value), "boolean flipped")
    elif isinstance(value, int) and off.text(start, end).isdigit() and value <= 10_000:
        add("off_by_one", node, fn, start, end, str(value + 1), "integer + 1")
        if value > 0:
            add("off_by_one", node, fn, start, end, str(value - 1), "integer - 1")
    elif isinstance(value, str) and 1 <= len(value) <= 12 and "\n" not in off.text(start, end):
        text = off.text(start, end)
        quote = text[-1]
        if (
            quote in "'\""
            and not text.startswith(("f", "b", "r", "F", "B", "R", "u", "U"))
            and len(text) >= 3
        ):
            inner = text[1:-1]
            if "\\" in inner:
                return
            changed = inner[:-1] if len(inner) > 1 else inner + inner
            add("change_constant", node, fn, start, end, quote + changed + quote, "string changed")
