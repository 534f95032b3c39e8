"""The grader's own checks: the trusted test files rewritten so that every verdict is made outside
the code under test, on plain data, against the gold implementation.

At grading time (:func:`~envs.repo_coding.grading.grade`) the trusted test files (base commit +
``test_patch``) are parsed with :mod:`ast` on the host and every check becomes a *site*:

* ``assert a == b`` (and ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in``, ``is``,
  ``is not``, chains), ``assert x``, ``assert not x``, ``assert ... == approx(...)``, and the
  unittest forms (``self.assertEqual`` ... ``assertIsInstance``, ``assertAlmostEqual``) become
  ``_fr_site(K, (operands...))``: the test records the **plain-data conversion** of each operand
  that is not a literal (*plain data*, below), nothing more. Literal operands (the expected values)
  stay on the host: they never enter the sandbox of the code under test.
* ``with pytest.raises(E)`` / ``with self.assertRaises(E)`` blocks also record what the body raised
  (the exception's class name, and its message when ``match=`` is given).
* **Variants.** Each top-level check whose operand calls something with literal arguments gets
  :data:`VARIANTS` extra records at the end of the test: the same expression with one literal
  argument perturbed (drawn per grading from the host's randomness). A patch that special-cases the
  inputs the issue text quotes records other values there than the gold implementation does.

The host runs the rewritten tests twice, in two fresh sandboxes, once on the gold patch and once on
the candidate, and judges the records with :mod:`envs.repo_coding.judge`.

Plain data, as records hold it: None, bool, int, float, complex, str, bytes, and list / tuple / dict / set /
frozenset of plain data. An instance of a subclass of one of these is converted to the base value
through the base type's own C methods (its overrides, e.g. ``__eq__``, are never called); an exception
to ("__exc__", class, args); a class to ("__type__", module, qualname); any other object to
("__obj__", module.qualname, attributes, defined-in-the-repository). Never compared with the
object's own ``__eq__``.
"""

from __future__ import annotations

import ast
import copy
import random
import string
from dataclasses import dataclass, field
from typing import Any

VARIANTS = 4  # extra perturbed records per literal call argument of a top-level check

_CMP = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_UNITTEST = {
    "assertEqual": "==",
    "assertEquals": "==",
    "assertNotEqual": "!=",
    "assertLess": "<",
    "assertLessEqual": "<=",
    "assertGreater": ">",
    "assertGreaterEqual": ">=",
    "assertIn": "in",
    "assertNotIn": "not in",
    "assertIs": "is",
    "assertIsNot": "is not",
    "assertCountEqual": "count==",
    "assertDictEqual": "==",
    "assertListEqual": "==",
    "assertTupleEqual": "==",
    "assertSetEqual": "==",
    "assertSequenceEqual": "==",
}
_MISSING = object()


@dataclass
class Operand:
    """One operand of a check: a literal kept on the host, or a value the test records."""

    kind: str  # "lit" | "val" | "approx"
    value: Any = None  # the literal (lit), or the approx's expected literal (approx with lit_expected)
    rel: float = 1e-6
    abs: float = 1e-12
    lit_expected: bool = False  # approx: the expected value is a literal (else it is recorded)


@dataclass
class Site:
    """One check of the trusted tests (see the module docstring)."""

    id: int
    kind: str  # "cmp" | "truth" | "raises" | "variant"
    file: str
    line: int
    ops: list[str] = field(default_factory=list)
    operands: list[Operand] = field(default_factory=list)
    negate: bool = False
    identity: list[int] = field(default_factory=list)  # op indexes whose `is` is recorded by the test

    def describe(self) -> str:
        return f"{self.file}:{self.line} ({self.kind})"


@dataclass
class Plan:
    """The rewritten test files and their sites."""

    files: dict[str, str]
    sites: dict[int, Site]


def _literal(node: ast.AST) -> Any:
    """The value of a literal expression node, or _MISSING."""
    if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "set"):
        return _MISSING
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _MISSING


def _is_approx(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "approx") or (
        isinstance(f, ast.Attribute) and f.attr == "approx"
    )


def _call(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])


# ----------------------------------------------------------------------------- perturbations


def perturb(value: Any, rng: random.Random) -> Any:
    """A nearby value of the same plain type (or _MISSING when ``value`` has none)."""
    t = type(value)
    if t is bool or value is None:
        return _MISSING
    if t is int:
        return value + rng.choice([-1, 1, 1, 2, -2]) if value not in (0, 1) else value + rng.choice([1, 1, 2])
    if t is float:
        return value + rng.choice([-0.75, 0.5, 1.25, 2.0])
    if t in (str, bytes):
        alphabet = [c for c in (value if t is str else value.decode("latin-1")) if c.isalnum()] or list(
            "abxyz"
        )
        pos = rng.randrange(len(value) + 1)
        ch = rng.choice(alphabet + list(string.ascii_lowercase[:6]))
        new = value if t is str else value.decode("latin-1")
        new = new[:pos] + ch + new[pos:]
        return new if t is str else new.encode("latin-1")
    if t in (list, tuple):
        items = list(value)
        idx = [i for i, v in enumerate(items) if perturb(v, random.Random(0)) is not _MISSING]
        if t is list and items and (not idx or rng.random() < 0.25):  # a tuple keeps its arity
            items.append(copy.deepcopy(items[rng.randrange(len(items))]))
        elif idx:
            i = rng.choice(idx)
            items[i] = perturb(items[i], rng)
        else:
            return _MISSING
        return t(items)
    if t is dict and value:
        keys = [k for k, v in value.items() if perturb(v, random.Random(0)) is not _MISSING]
        if not keys:
            return _MISSING
        k = rng.choice(keys)
        return {**value, k: perturb(value[k], rng)}
    return _MISSING


def _perturbable_slots(expr: ast.expr) -> list[tuple[ast.Call, str, int | str]]:
    """(call, "arg"/"kw", index/name) of every literal argument of a call in ``expr``."""
    out = []
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and not _is_approx(node):
            for i, a in enumerate(node.args):
                if not isinstance(a, ast.Starred) and _literal(a) is not _MISSING:
                    out.append((node, "arg", i))
            for kw in node.keywords:
                if kw.arg and _literal(kw.value) is not _MISSING:
                    out.append((node, "kw", kw.arg))
    return out


def _variant_expr(expr: ast.expr, rng: random.Random) -> ast.expr | None:
    """A copy of ``expr`` with one literal call argument perturbed, or None."""
    for _ in range(6):
        e = copy.deepcopy(expr)
        slots = _perturbable_slots(e)
        if not slots:
            return None
        call, how, key = rng.choice(slots)
        node = call.args[key] if how == "arg" else next(k.value for k in call.keywords if k.arg == key)
        new = perturb(_literal(node), rng)
        if new is _MISSING:
            continue
        repl = ast.parse(repr(new), mode="eval").body
        if how == "arg":
            call.args[key] = repl
        else:
            next(k for k in call.keywords if k.arg == key).value = repl
        return e
    return None


# ----------------------------------------------------------------------------- the rewrite


class _Rewriter(ast.NodeTransformer):
    def __init__(self, path: str, sites: dict[int, Site], rng: random.Random) -> None:
        self.path, self.sites, self.rng = path, sites, rng
        self.fn_depth = 0
        self.top: list[tuple[Site, list[ast.expr]]] = []  # top-level checks of the current test

    def _new(self, kind: str, node: ast.AST, **kw: Any) -> Site:
        sid = max(self.sites, default=0) + 1
        site = Site(sid, kind, self.path, getattr(node, "lineno", 0), **kw)
        self.sites[sid] = site
        return site

    def _record(self, site: Site, values: list[ast.expr], node: ast.stmt) -> ast.stmt:
        args: list[ast.expr] = [ast.Constant(site.id), ast.Tuple(elts=values, ctx=ast.Load())]
        if site.identity:
            args.append(ast.Tuple(elts=[ast.Constant(i) for i in site.identity], ctx=ast.Load()))
        stmt = ast.Expr(_call("_fr_site", *args))
        return ast.copy_location(stmt, node)

    def _operand(self, node: ast.expr) -> tuple[Operand, ast.expr | None]:
        if _is_approx(node) and node.args:
            kws = {k.arg: _literal(k.value) for k in node.keywords}
            if all(v is not _MISSING and k in ("rel", "abs") for k, v in kws.items()):
                op = Operand("approx", rel=kws.get("rel", 1e-6) or 0.0, abs=kws.get("abs", 1e-12) or 0.0)
                lit = _literal(node.args[0])
                if lit is not _MISSING:
                    op.value, op.lit_expected = lit, True
                    return op, None
                return op, node.args[0]
        lit = _literal(node)
        if lit is not _MISSING:
            return Operand("lit", lit), None
        return Operand("val"), node

    def _compare(self, node: ast.stmt, left: ast.expr, ops: list[str], rights: list[ast.expr]) -> ast.stmt:
        operands, values = [], []
        for e in [left, *rights]:
            op, val = self._operand(e)
            operands.append(op)
            if val is not None:
                values.append(val)
        identity = [
            i
            for i, o in enumerate(ops)
            if o in ("is", "is not")
            and not any(
                operands[j].kind == "lit" and operands[j].value in (None, True, False) for j in (i, i + 1)
            )
        ]
        site = self._new("cmp", node, ops=ops, operands=operands, identity=identity)
        if identity:  # `a is b` on two computed values: the test records the identity itself
            site.operands = [Operand("val") if o.kind == "lit" else o for o in operands]
            values = [left, *rights]
        return self._track(site, values, node)

    def _truth(self, node: ast.stmt, expr: ast.expr, negate: bool) -> ast.stmt:
        site = self._new("truth", node, operands=[Operand("val")], negate=negate)
        return self._track(site, [expr], node)

    def _track(self, site: Site, values: list[ast.expr], node: ast.stmt) -> ast.stmt:
        if self.fn_depth == 1:
            self.top.append((site, values))
        return self._record(site, values, node)

    # -- statements

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        t = node.test
        if isinstance(t, ast.Compare):
            return self._compare(node, t.left, [_CMP[type(o)] for o in t.ops], list(t.comparators))
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            return self._truth(node, t.operand, True)
        return self._truth(node, t, False)

    def _raises_call(self, node: ast.Expr, c: ast.Call) -> ast.stmt:
        """``raises(E, f, *args, **kw)`` as a statement: also record what ``f(*args, **kw)`` raised."""
        site = self._new("raises", node)
        inner = ast.Call(
            func=c.args[1], args=c.args[2:], keywords=[k for k in c.keywords if k.arg != "match"]
        )
        exc = ast.Name(id="_fr_e", ctx=ast.Load())
        handler = ast.ExceptHandler(
            type=ast.Name(id="BaseException", ctx=ast.Load()),
            name="_fr_e",
            body=[ast.Expr(_call("_fr_raised", ast.Constant(site.id), exc, ast.Constant(False)))],
        )
        record = ast.Try(
            body=[ast.Expr(inner)],
            handlers=[handler],
            orelse=[
                ast.Expr(_call("_fr_raised", ast.Constant(site.id), ast.Constant(None), ast.Constant(False)))
            ],
            finalbody=[],
        )
        return [ast.copy_location(record, node), node]

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        c = node.value
        if (
            isinstance(c, ast.Call)
            and len(c.args) >= 2
            and not any(isinstance(a, ast.Starred) for a in c.args[:2])
            and (
                (isinstance(c.func, ast.Attribute) and c.func.attr in ("raises", "assertRaises"))
                or (isinstance(c.func, ast.Name) and c.func.id == "raises")
            )
        ):
            return self._raises_call(node, c)
        if not (
            isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name)
            and c.func.value.id == "self"
        ):
            return node
        name, args = c.func.attr, [a for a in c.args if not isinstance(a, ast.Starred)]
        if len(args) != len(c.args):
            return node
        kw = {k.arg: k.value for k in c.keywords}
        if name in _UNITTEST and len(args) >= 2:
            op = _UNITTEST[name]
            if op == "count==":
                sorted_ = [_call("sorted", _call("list", a)) for a in args[:2]]
                return self._compare(node, sorted_[0], ["=="], [sorted_[1]])
            return self._compare(node, args[0], [op], [args[1]])
        if name in ("assertTrue", "assert_") and args:
            return self._truth(node, args[0], False)
        if name == "assertFalse" and args:
            return self._truth(node, args[0], True)
        if name in ("assertIsNone", "assertIsNotNone") and args:
            return self._compare(
                node, args[0], ["is" if name == "assertIsNone" else "is not"], [ast.Constant(None)]
            )
        if name in ("assertIsInstance", "assertNotIsInstance") and len(args) >= 2:
            return self._truth(node, _call("isinstance", args[0], args[1]), name == "assertNotIsInstance")
        if name in ("assertAlmostEqual", "assertNotAlmostEqual") and len(args) >= 2 and "delta" not in kw:
            places = _literal(args[2]) if len(args) > 2 else _literal(kw["places"]) if "places" in kw else 7
            if places is _MISSING:
                return node
            tol = 0.5 * 10.0 ** (-places)
            approx = ast.Call(
                func=ast.Name(id="approx", ctx=ast.Load()),
                args=[args[1]],
                keywords=[ast.keyword("rel", ast.Constant(0.0)), ast.keyword("abs", ast.Constant(tol))],
            )
            return self._compare(node, args[0], ["==" if name == "assertAlmostEqual" else "!="], [approx])
        return node

    def visit_With(self, node: ast.With) -> ast.stmt:
        self.generic_visit(node)
        if len(node.items) != 1:
            return node
        ctx = node.items[0].context_expr
        if not (isinstance(ctx, ast.Call) and isinstance(ctx.func, ast.Attribute | ast.Name)):
            return node
        fname = ctx.func.attr if isinstance(ctx.func, ast.Attribute) else ctx.func.id
        if fname not in ("raises", "assertRaises"):
            return node
        match = any(k.arg == "match" for k in ctx.keywords)
        site = self._new("raises", node, negate=match)
        exc = ast.Name(id="_fr_e", ctx=ast.Load())
        handler = ast.ExceptHandler(
            type=ast.Name(id="BaseException", ctx=ast.Load()),
            name="_fr_e",
            body=[
                ast.Expr(_call("_fr_raised", ast.Constant(site.id), exc, ast.Constant(match))),
                ast.Raise(exc=None, cause=None),
            ],
        )
        guarded = ast.Try(
            body=node.body,
            handlers=[handler],
            orelse=[
                ast.Expr(_call("_fr_raised", ast.Constant(site.id), ast.Constant(None), ast.Constant(match)))
            ],
            finalbody=[],
        )
        node.body = [guarded]
        return node

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        outer_top, self.top = self.top, []
        self.fn_depth += 1
        try:
            # Only the body's own statements are "top level" (not nested blocks or functions).
            new_body = []
            for stmt in node.body:
                if isinstance(stmt, ast.Assert | ast.Expr):
                    new_body.append(self.visit(stmt))
                else:
                    self.fn_depth += 1
                    new_body.append(self.visit(stmt))
                    self.fn_depth -= 1
            flat: list[ast.stmt] = []
            for s in new_body:
                flat.extend(s if isinstance(s, list) else [s] if s is not None else [])
            node.body = flat
            node.decorator_list = [self.visit(d) for d in node.decorator_list]
            is_gen = any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node))
            if node.name.startswith("test") and not is_gen:
                node.body += self._variants(node)
        finally:
            self.fn_depth -= 1
            self.top = outer_top
        return node

    @staticmethod
    def _literal_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
        """Names the test binds exactly once, at its top level, to a literal (``x = [3, 1, 2]``)."""
        stores: dict[str, int] = {}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
                stores[n.id] = stores.get(n.id, 0) + 1
        out = {}
        for st in node.body:
            if (
                isinstance(st, ast.Assign)
                and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)
                and stores.get(st.targets[0].id) == 1
                and _literal(st.value) is not _MISSING
            ):
                out[st.targets[0].id] = st.value
        return out

    def _variants(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        names = self._literal_names(node)

        class _Inline(ast.NodeTransformer):
            def visit_Call(self, call: ast.Call) -> ast.AST:
                self.generic_visit(call)
                call.args = [
                    copy.deepcopy(names[a.id]) if isinstance(a, ast.Name) and a.id in names else a
                    for a in call.args
                ]
                for k in call.keywords:
                    if isinstance(k.value, ast.Name) and k.value.id in names:
                        k.value = copy.deepcopy(names[k.value.id])
                return call

        for site, values in self.top:
            values = [_Inline().visit(copy.deepcopy(v)) for v in values] if names else values
            seen: set[str] = {ast.unparse(v) for v in values}
            made = 0
            for _ in range(VARIANTS * 3):  # distinct variants, differing from the check's own inputs
                if made == VARIANTS:
                    break
                for v in values:
                    e = _variant_expr(v, self.rng)
                    if e is None:
                        continue
                    text = ast.unparse(e)
                    if text in seen:
                        break
                    seen.add(text)
                    made += 1
                    var = self._new("variant", node)
                    var.line = site.line
                    lam = ast.Lambda(
                        args=ast.arguments(
                            posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]
                        ),
                        body=e,
                    )
                    out.append(ast.Expr(_call("_fr_variant", ast.Constant(var.id), lam)))
                    break
        return out

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._function(node)


def rewrite(files: dict[str, str], rng: random.Random) -> Plan:
    """Rewrite the trusted test files (path -> text) into their recording form (see the module
    docstring). A file that does not parse is kept as it is (its tests then fail in both runs)."""
    sites: dict[int, Site] = {}
    out: dict[str, str] = {}
    for path in sorted(files):
        try:
            tree = ast.parse(files[path])
        except SyntaxError:
            out[path] = files[path]
            continue
        tree = _Rewriter(path, sites, rng).visit(tree)
        ast.fix_missing_locations(tree)
        out[path] = ast.unparse(tree) + "\n"
    return Plan(out, sites)
