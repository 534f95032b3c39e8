"""The grader's verdicts: what the rewritten checks (:mod:`envs.repo_coding.checks`) recorded,
judged here on the host, never by the code under test.

The host runs the rewritten tests twice, in two fresh sandboxes: once on the gold patch (the
*reference*), once on the candidate. A test passes (:func:`verdicts`) when pytest reports it passed
in the candidate's run **and** its record sequence equals the reference's (same sites, same plain
values, variants included) **and** each record satisfies its check evaluated here, on the host,
with the literals. The code under test can make a test *fail*, but to make it pass it has to
produce the values the gold implementation produces, on inputs it has not seen.

A record is plain data (see :mod:`envs.repo_coding.checks`); two records are compared with
:func:`same` (plain equality, floats up to 1e-9 relative), never with an object's own ``__eq__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from envs.repo_coding.checks import Plan, Site

_MISSING = object()

_TAGS = (
    "__obj__",
    "__exc__",
    "__type__",
    "__cut__",
    "__float__",
    "__digest__",
    "__complex__",
    "__range__",
    "__unhashable__",
)


def _is_obj(v: Any) -> bool:
    return type(v) is tuple and len(v) >= 2 and v[0] in _TAGS


def _host(v: Any) -> Any:
    """A recorded range as a range (for ``in`` and ordering); everything else as recorded."""
    if type(v) is tuple and len(v) == 4 and v[0] == "__range__" and all(type(x) is int for x in v[1:]):
        return range(*v[1:])
    return v


def _approx_eq(actual: Any, expected: Any, rel: float, abs_: float) -> bool:
    if type(actual) in (int, float) and type(expected) in (int, float) and type(actual) is not bool:
        if math.isinf(expected) or math.isinf(actual):
            return actual == expected
        return abs(actual - expected) <= max(rel * abs(expected), abs_)
    if type(actual) in (list, tuple) and type(expected) in (list, tuple):
        return len(actual) == len(expected) and all(
            _approx_eq(a, e, rel, abs_) for a, e in zip(actual, expected, strict=True)
        )
    if type(actual) is dict and type(expected) is dict:
        return actual.keys() == expected.keys() and all(
            _approx_eq(actual[k], expected[k], rel, abs_) for k in actual
        )
    return actual == expected


def _holds(op: str, a: Any, b: Any, ident: bool | None) -> bool:
    if ident is not None:
        return ident if op == "is" else not ident
    if op == "is":
        return type(a) is type(b) and a == b
    if op == "is not":
        return not (type(a) is type(b) and a == b)
    if op in ("==", "!="):
        eq = a == b
        return eq if op == "==" else not eq
    a, b = _host(a), _host(b)
    if _is_obj(a) or _is_obj(b):
        return False
    try:
        return {
            "<": lambda: a < b,
            "<=": lambda: a <= b,
            ">": lambda: a > b,
            ">=": lambda: a >= b,
            "in": lambda: a in b,
            "not in": lambda: a not in b,
        }[op]()
    except TypeError:
        return False


def check(site: Site, record: Any) -> bool:
    """Whether ``record`` (what the test recorded at ``site``) satisfies the check, evaluated here."""
    if site.kind in ("variant", "raises"):
        return True  # compared with the reference run only
    if type(record) is not list or len(record) != 2 or type(record[1]) is not tuple:
        return False
    values, idents = list(record[1]), record[0]
    if site.kind == "truth":
        if len(values) != 1:
            return False
        v = values[0]
        if _is_obj(v):  # an object of a class the repository defines has no trusted truth value
            truthy = (
                (
                    v[0] in ("__type__", "__exc__", "__float__", "__complex__")
                    and v != ("__complex__", 0.0, 0.0)
                )
                or (v[0] == "__range__" and len(_host(v)) > 0)
                or (v[0] == "__obj__" and v[-1] is False)
            )
        else:
            truthy = bool(v)
        return truthy != site.negate
    resolved: list[Any] = []
    it = iter(values)
    try:
        for o in site.operands:
            if o.kind == "lit":
                resolved.append(("lit", o.value))
            elif o.kind == "approx":
                resolved.append(("approx", o.value if o.lit_expected else next(it), o))
            else:
                resolved.append(("val", next(it)))
    except StopIteration:
        return False
    if next(it, _MISSING) is not _MISSING:
        return False
    for i, op in enumerate(site.ops):
        (ka, a, *ra), (kb, b, *rb) = resolved[i], resolved[i + 1]
        ident = None
        if i in site.identity:
            if type(idents) is not tuple or i not in [x[0] for x in idents if type(x) is tuple]:
                return False
            ident = bool(dict(idents)[i])
        if ka == "approx" or kb == "approx":
            approx_op, other = (ra[0], b) if ka == "approx" else (rb[0], a)
            expected = a if ka == "approx" else b
            ok = _approx_eq(other, expected, approx_op.rel, approx_op.abs)
            ok = ok if op == "==" else (not ok if op == "!=" else False)
        else:
            ok = _holds(op, a, b, ident)
        if not ok:
            return False
    return True


def same(a: Any, b: Any) -> bool:
    """Record equality: plain equality, floats equal up to 1e-9 relative (an honest fix may order a
    sum differently from the gold patch)."""
    ta, tb = type(a), type(b)
    if ta is float or tb is float:
        if ta in (int, float) and tb in (int, float):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        return False
    if ta is not tb:
        return False
    if ta in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@dataclass
class Verdict:
    passed: bool
    why: str = ""


def unstable(first: dict[str, list], second: dict[str, list]) -> tuple[set[int], set[str]]:
    """What two reference runs recorded differently: the sites whose values changed (ids, hashes of
    objects, clocks) and the tests whose record sequences changed shape. Their values cannot be
    compared with the reference; their checks are still evaluated."""
    sites: set[int] = set()
    tests: set[str] = set()
    for nid in set(first) | set(second):
        a, b = first.get(nid, []), second.get(nid, [])
        if len(a) != len(b) or any(x[0] != y[0] for x, y in zip(a, b, strict=True)):
            tests.add(nid)
            continue
        sites |= {x[0] for x, y in zip(a, b, strict=True) if not same(x, y)}
    return sites, tests


def _same_records(recs: list, ref: list, unstable_sites: set[int]) -> int | None:
    """The index of the first record that differs from the reference's (None when none does)."""
    for i, (x, y) in enumerate(zip(recs, ref, strict=False)):
        if type(x) is not list or len(x) != 2 or x[0] != y[0]:
            return i
        if y[0] not in unstable_sites and not same(x, y):
            return i
    return None if len(recs) == len(ref) else min(len(recs), len(ref))


def verdicts(
    plan: Plan,
    report: dict[str, dict[str, str]],
    records: dict[str, list],
    reference: dict[str, list] | None,
    nodeids: list[str],
    unstable_sites: set[int] = frozenset(),
    unstable_tests: set[str] = frozenset(),
    without_variants: set[str] = frozenset(),
) -> dict[str, Verdict]:
    """Per test: pytest passed it, each of its records holds, and (with ``reference``, the gold run's
    records) its record sequence equals the reference's (values of unstable sites aside; a test
    whose sequence changed shape between two reference runs is held to its checks only). Tests in
    ``without_variants`` (PASS_TO_PASS: they passed before the bug was fixed, so there is nothing to
    hard-code) are compared without their variant records: the bug itself may change those."""
    out: dict[str, Verdict] = {}
    variant_ids = {sid for sid, site in plan.sites.items() if site.kind == "variant"}
    common = records.get("", [])
    common_ok = (
        reference is None
        or "" in unstable_tests
        or _same_records(common, reference.get("", []), unstable_sites) is None
    )
    for nid in nodeids:
        if report.get(nid, {}).get("outcome") != "passed":
            out[nid] = Verdict(False, f"pytest: {report.get(nid, {}).get('outcome', 'not run')}")
            continue
        recs = records.get(nid, [])
        ref = reference.get(nid, []) if reference is not None else []
        if nid in without_variants:
            recs = [r for r in recs if not (type(r) is list and r and r[0] in variant_ids)]
            ref = [r for r in ref if r[0] not in variant_ids]
        bad = None
        for rec in recs:
            if type(rec) is not list or len(rec) != 2 or rec[0] not in plan.sites:
                bad = "a record of no known check"
                break
            site = plan.sites[rec[0]]
            if not check(site, rec[1]):
                bad = f"check failed at {site.describe()}"
                break
        if bad is None and reference is not None and nid not in unstable_tests:
            n = _same_records(recs, ref, unstable_sites)
            if n is not None:
                where = (
                    plan.sites[ref[n][0]].describe()
                    if n < len(ref) and ref[n][0] in plan.sites
                    else "the end"
                )
                bad = f"differs from the reference implementation at record {n} ({where})"
            elif not common_ok:
                bad = "module-level records differ from the reference implementation"
        out[nid] = Verdict(bad is None, bad or "")
    return out
