"""Running pytest and reading its per-test outcomes: sealed in a sandbox, plain on the host.

Outcomes are one JSON object, ``{node id: {"outcome": "passed"|"failed"|"skipped", "message": str}}``,
recorded by pytest hooks (exact, no parsing of pytest's text output; pytest 7, the sandbox image's
``python3-pytest``, and newer). Plugin auto-loading is switched off and ``addopts`` emptied so that a
repository's own pytest configuration (coverage flags, plugins) cannot break or fake a run.

Two ways to run:

* :func:`run_pytest` (grading and the agent's ``run_tests``: the repository is untrusted) runs the
  :data:`RUNNER` harness with ``python3 -s -B`` in an emptied environment (``env -i``, a fixed hash
  seed). It reads a per-run secret on stdin before anything of the repository is importable, loads
  pytest and its own modules from the interpreter's path, then makes the repository importable for
  the tests behind a guard that keeps the runner's module names (the standard library, pytest and
  everything it loaded) out of the repository's reach, registers its report hooks as an object (no
  module name to shadow), and after the session seals the report (:mod:`tools_sandbox.sealed`),
  serialised with ``repr`` of exact builtin values (no module function the repository could wrap).
  The report carries what the grader's rewritten checks recorded (``_fr_site``, ``_fr_raised``,
  ``_fr_variant``: :mod:`envs.repo_coding.checks`), the functions of pytest, pluggy, the builtins and
  the harness that were rebound during the run (``tampered``) and the plugins registered while the
  session ran (``late_plugins``); the grader scores either as a failure.
* :func:`pytest_shell` + :data:`REPORT_PLUGIN` (the offline task builder, on the project's own seed
  repositories and pinned sdists) writes the report to ``$FR_REPORT_PATH``.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

PLUGIN_MODULE = "_fr_report"

REPORT_PLUGIN = '''\
"""fr-agents: record every test's outcome to $FR_REPORT_PATH as JSON."""
import json
import os

_results = {}


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr or "")[-400:]


def pytest_runtest_logreport(report):
    prev = _results.get(report.nodeid)
    if report.failed:
        if prev is None or prev["outcome"] != "failed":
            _results[report.nodeid] = {"outcome": "failed", "message": _message(report)[:1000]}
    elif prev is not None and prev["outcome"] == "failed":
        return
    elif report.when == "call":
        outcome = "skipped" if (report.skipped or hasattr(report, "wasxfail")) else "passed"
        _results[report.nodeid] = {"outcome": outcome, "message": ""}
    elif report.skipped:
        _results[report.nodeid] = {"outcome": "skipped", "message": ""}


def pytest_collectreport(report):
    if report.failed:
        _results["<collect>::" + report.nodeid] = {"outcome": "failed", "message": _message(report)[:1000]}


_lines = {}
_traced = {}


def _local(frame, event, arg):
    if event == "line":
        _lines[_traced[frame.f_code.co_filename]].add(frame.f_lineno)
    return _local


def _global(frame, event, arg):
    name = frame.f_code.co_filename
    if name not in _traced:
        rel = os.path.relpath(os.path.abspath(name))
        _traced[name] = rel if rel in _lines else None
    if _traced[name] is None:
        return None
    _lines[_traced[name]].add(frame.f_lineno)
    return _local


def pytest_configure(config):
    # FR_TRACE_FILES (builder only): record which lines of these files the tests execute.
    files = os.environ.get("FR_TRACE_FILES")
    if files:
        import sys
        import threading

        for f in files.split(os.pathsep):
            _lines[os.path.normpath(f)] = set()
        sys.settrace(_global)
        threading.settrace(_global)


def pytest_sessionfinish(session, exitstatus):
    if _lines:
        _results["<lines>"] = {"outcome": "trace", "files": {k: sorted(v) for k, v in _lines.items()}}
    with open(os.environ["FR_REPORT_PATH"], "w") as f:
        json.dump(_results, f)
'''


def pytest_shell(
    files: list[str],
    report_path: str,
    plugin_dir: str,
    python: str = "python3",
    trace: list[str] | None = None,
) -> str:
    """The shell command (run in the repository root) that tests ``files`` and writes the report;
    ``trace`` (builder only) also records the executed lines of those source files."""
    env = (
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 "
        f"PYTHONPATH={shlex.quote(plugin_dir)}:. FR_REPORT_PATH={shlex.quote(report_path)}"
    )
    if trace:
        env += f" FR_TRACE_FILES={shlex.quote(':'.join(trace))}"
    targets = " ".join(shlex.quote(f) for f in files)
    return (
        f"{env} {shlex.quote(python)} -m pytest -q -p {PLUGIN_MODULE} -p no:cacheprovider "
        f"--tb=short -o addopts= -o console_output_style=classic {targets}"
    )


def passed_ids(report: dict[str, dict[str, str]]) -> set[str]:
    return {nid for nid, r in report.items() if r.get("outcome") == "passed"}


def partial_score(f2p_passed: int, f2p_total: int, p2p_all_pass: bool) -> float:
    """The partial-progress score of a graded attempt.

    ``partial_score = (FAIL_TO_PASS passing / FAIL_TO_PASS total) * (1.0 if every PASS_TO_PASS
    passes else 0.5)``: progress on the bug counts fully only when nothing that worked was broken.
    """
    if f2p_total <= 0:
        raise ValueError("f2p_total must be positive")
    return (f2p_passed / f2p_total) * (1.0 if p2p_all_pass else 0.5)


# ----------------------------------------------------------------------------- the sealed runner

PYTEST_ARGS = [
    "-q",
    "-p",
    "no:cacheprovider",
    "--tb=short",
    "-o",
    "addopts=",
    "-o",
    "console_output_style=classic",
    "--color=no",
]

# The in-sandbox harness (after tools_sandbox.sealed.PRELUDE), run in the repository root as
# ``python3 -I -B RUNNER RESULT_PATH PYTEST_ARGS...`` with the run's secret on stdin.
RUNNER = r'''
import builtins
import importlib
import importlib.machinery
import os
import pkgutil
import sys
import traceback
import types

# Captured before any repository code can run: C functions and slot wrappers nobody can rebind.
_repr, _type, _len, _issubclass, _hash, _sorted = repr, type, len, issubclass, hash, sorted
_str_add, _tuple_add, _list_add = str.__add__, tuple.__add__, list.__add__
_bytes_add, _dict_copy, _set_union = bytes.__add__, dict.copy, set.union
_int_int, _float_float, _float_repr = int.__int__, float.__float__, float.__repr__
_qualname_of = type.__dict__["__qualname__"].__get__
_module_of = type.__dict__["__module__"].__get__
_exc_args = BaseException.__dict__["args"].__get__
_fn_name = types.FunctionType.__dict__["__qualname__"].__get__
_fn_module = types.FunctionType.__dict__["__module__"].__get__
_getattribute = object.__getattribute__
_realpath, _sep, _modules = os.path.realpath, os.sep, sys.modules
_sha256 = _fr_hashlib.sha256
_mp_copy = types.MappingProxyType.copy
_KEYS, _VALUES, _ITEMS = type({}.keys()), type({}.values()), type({}.items())
_INF = float("inf")
_BASES = ((int, _int_int), (float, _float_float), (str, lambda v: _str_add("", v)),
          (bytes, lambda v: _bytes_add(b"", v)), (tuple, lambda v: _tuple_add((), v)),
          (list, lambda v: _list_add([], v)), (dict, _dict_copy), (set, lambda v: _set_union(set(), v)),
          (frozenset, lambda v: _set_union(set(), v)))

_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, property,
          staticmethod, classmethod, types.MethodType, types.WrapperDescriptorType)
_WATCHED = ("_pytest", "pytest", "pluggy", "builtins", "__main__")


class _Guard:
    """A meta-path finder: the runner's own module names are found outside the repository only."""

    def __init__(self, root, names):
        self.root, self.names = root, frozenset(names)

    def _outside(self):
        out = []
        for p in sys.path:
            a = os.path.realpath(os.path.abspath(p or "."))
            if a != self.root and not a.startswith(self.root + os.sep):
                out.append(p)
        return out

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in self.names:
            return None  # submodules are found on their (already guarded) package's __path__
        if name in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(name):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, self._outside())
        if spec is None:
            raise ModuleNotFoundError(f"{name!r} is a module name of the test runner; "
                                      "the repository cannot provide it", name=name)
        return spec


def _hashable(x):
    try:
        _hash(x)
        return True
    except BaseException:  # noqa: BLE001
        return False


def _exact_str(v):
    return _str_add("", v) if _issubclass(_type(v), str) else "<not a str>"


class _Records:
    """What the rewritten checks record, per test: [site id, plain data] (see envs/repo_coding/checks.py)."""

    LIMIT = 20000

    def __init__(self, root):
        self.root, self.by_test, self.current = root, {}, ""

    def _from_repo(self, t):
        try:
            mod = _modules.get(_module_of(t))
            path = mod.__dict__.get("__file__") if mod is not None else None
            return _type(path) is str and _realpath(path).startswith(self.root + _sep)
        except BaseException:  # noqa: BLE001
            return True

    def _name(self, t):
        try:
            return _exact_str(_module_of(t)) + "." + _exact_str(_qualname_of(t))
        except BaseException:  # noqa: BLE001
            return "?"

    def plain(self, v, budget, depth=0):
        t = _type(v)
        if v is None or t is bool or t is int or t is str or t is bytes:
            return v
        if t is float:
            return v if (v == v and v != _INF and v != -_INF) else ("__float__", _float_repr(v))
        if budget[0] <= 0 or depth > 40:
            return ("__cut__", self._name(t))
        budget[0] -= 1
        d = depth + 1
        if t is complex:
            return ("__complex__", v.real, v.imag)
        if t is list:
            return [self.plain(x, budget, d) for x in v]
        if t is tuple:
            return tuple([self.plain(x, budget, d) for x in v])
        if t is dict:
            return {self.key(k, budget, d): self.plain(x, budget, d) for k, x in v.items()}
        if t is set or t is frozenset:
            return {self.key(x, budget, d) for x in v}
        if t is types.MappingProxyType:  # a class's __dict__
            inner = _mp_copy(v)
            return self.plain(inner, budget, depth) if _type(inner) is dict else ("__obj__", "mappingproxy", None, False)
        if t is _KEYS or t is _ITEMS:  # set-like views: compared as sets (of plain data)
            return self.plain(set(v), budget, depth) if all(_hashable(x) for x in v) else self.plain(list(v), budget, depth)
        if t is _VALUES:
            return self.plain(list(v), budget, depth)
        if t is range:
            return ("__range__", v.start, v.stop, v.step)
        if _issubclass(t, type):
            return ("__type__", self._name(v))
        if _issubclass(t, BaseException):
            return ("__exc__", self._name(t), self.plain(_exc_args(v), budget, d))
        for base, conv in _BASES:
            if _issubclass(t, base):  # the base value, read by the base type's own C code
                return self.plain(conv(v), budget, depth)
        if _issubclass(t, types.ModuleType):
            return ("__obj__", "module", self._name(t), False)
        if t is types.FunctionType:  # a function is its name (two lambdas are not told apart)
            try:
                name = _exact_str(_fn_module(v) or "") + "." + _exact_str(_fn_name(v))
            except BaseException:  # noqa: BLE001
                name = "?"
            return ("__obj__", "function", name, False)
        try:
            attrs = _getattribute(v, "__dict__")
            attrs = self.plain(_dict_copy(attrs), budget, d) if _issubclass(_type(attrs), dict) else None
        except BaseException:  # noqa: BLE001 - no __dict__, or one that raises
            attrs = None
        return ("__obj__", self._name(t), attrs, self._from_repo(t))

    def key(self, k, budget, depth):
        p = self.plain(k, budget, depth)
        try:
            _hash(p)
            return p
        except BaseException:  # noqa: BLE001
            return ("__unhashable__", _repr(p))

    BUDGET = 4000  # nodes of one recorded value; a larger value is recorded as a digest of its data

    def small(self, value):
        budget = [self.BUDGET]
        p = self.plain(value, budget)
        if budget[0] <= 0:
            p = ("__digest__", _sha256(_repr(p).encode("utf-8", "backslashreplace")).hexdigest())
        return p

    def add(self, sid, payload):
        recs = self.by_test.setdefault(self.current, [])
        if _len(recs) < self.LIMIT:
            recs.append([sid, payload])

    def site(self, sid, values, idents=None):
        pairs = None
        if idents is not None:
            pairs = tuple([(i, values[i] is values[i + 1]) for i in idents])
        self.add(sid, [pairs, self.small(values)])

    def raised(self, sid, exc, match):
        if exc is None:
            self.add(sid, None)
            return
        msg = None
        if match:
            try:
                msg = _exact_str(str(exc))
            except BaseException:  # noqa: BLE001
                msg = "<unprintable>"
        self.add(sid, (self._name(_type(exc)), msg))

    def variant(self, vid, fn):
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - what the code raised is the record
            self.add(vid, ["raised", self._name(_type(e))])
            return
        self.add(vid, ["ok", self.small(value)])


class _Report:
    """The report hooks (registered as an object: there is no module name to shadow)."""

    def __init__(self, records):
        self.tests, self.finished, self.exit_status = {}, False, None
        self.records, self.started, self.late_plugins, self.foreign = records, False, [], []

    def pytest_collection_modifyitems(self, session, config, items):
        # A test whose function was not compiled from its own file (a module swapped in sys.modules,
        # a function built from a string) is not the trusted test: it counts as failed.
        for item in items:
            code = getattr(getattr(item, "function", None), "__code__", None)
            path = getattr(item, "path", None) or getattr(item, "fspath", None)
            if code is not None and path is not None and _realpath(code.co_filename) != _realpath(str(path)):
                self.foreign.append(_exact_str(item.nodeid))

    def pytest_sessionstart(self, session):
        self.started = True

    def pytest_plugin_registered(self, plugin, manager):
        if not self.started:
            return
        t = _type(plugin)
        name = plugin.__name__ if _issubclass(t, types.ModuleType) else _module_of(t)
        if _type(name) is not str or name.partition(".")[0] not in ("_pytest", "pytest"):
            # a plugin registered at run time by anything but pytest itself (code under test): refused
            self.late_plugins.append(_exact_str(_repr(t)) + " " + _exact_str(_repr(name)))

    def pytest_runtest_logstart(self, nodeid, location):
        self.records.current = _exact_str(nodeid)
        _random_seed(self.records.current)  # the reference and the candidate draw the same numbers

    def pytest_runtest_logfinish(self, nodeid, location):
        self.records.current = ""

    @staticmethod
    def _message(report):
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            return str(crash.message)
        return str(report.longrepr or "")[-400:]

    def pytest_runtest_logreport(self, report):
        report.nodeid = _exact_str(report.nodeid)
        prev = self.tests.get(report.nodeid)
        if report.failed:
            if prev is None or prev["outcome"] != "failed":
                self.tests[report.nodeid] = {"outcome": "failed", "message": _exact_str(self._message(report))[:1000]}
        elif prev is not None and prev["outcome"] == "failed":
            return
        elif report.when == "call":
            outcome = "skipped" if (report.skipped or hasattr(report, "wasxfail")) else "passed"
            self.tests[report.nodeid] = {"outcome": outcome, "message": ""}
        elif report.skipped:
            self.tests[report.nodeid] = {"outcome": "skipped", "message": ""}

    def pytest_collectreport(self, report):
        if report.failed:
            self.tests["<collect>::" + _exact_str(report.nodeid)] = {
                "outcome": "failed", "message": _exact_str(self._message(report))[:1000]}

    def pytest_sessionfinish(self, session, exitstatus):
        self.finished, self.exit_status = True, int(exitstatus)


def _snapshot():
    """Functions, classes and their members (as the classes resolve them, through their bases) bound
    in the runner's modules: what tested code could rebind to fake outcomes."""
    out = {}
    for name, mod in list(sys.modules.items()):
        if name.partition(".")[0] not in _WATCHED:
            continue
        for attr, v in list(getattr(mod, "__dict__", {}).items()):
            if isinstance(v, _KINDS):
                out[name + "." + attr] = v
            if isinstance(v, type) and getattr(v, "__module__", None) == name:
                members = {}
                for base in reversed(v.__mro__):
                    members.update(base.__dict__)
                for k, m in members.items():
                    if isinstance(m, _KINDS):
                        out[name + "." + attr + "." + k] = m
    return out


def _rebound(snap):
    now = _snapshot()
    return sorted(label for label, v in snap.items() if now.get(label) is not v)


def main():
    secret = _fr_take_secret()
    out = _fr_private_stdout()
    here = _realpath(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if p and _realpath(p) != here]  # not the runner's own folder
    result_path, args = sys.argv[1], sys.argv[2:]
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest
    import _pytest
    for m in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        try:
            importlib.import_module(m.name)
        except Exception:  # noqa: BLE001 - an optional part (e.g. a missing extra)
            pass
    global _random_seed
    import random
    _random_seed = random.seed
    names = (set(sys.stdlib_module_names) - {"test"}) | {n.partition(".")[0] for n in sys.modules}
    names.discard("test")  # the stdlib's test package name is what repositories call their tests
    names |= {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "pygments", "argcomplete",
              "exceptiongroup", "tomli", "colorama", "attr", "attrs"}
    root = os.path.realpath(os.getcwd())
    records = _Records(root)
    # The rewritten checks call these (found through the builtins; rebinding one is tampering).
    builtins._fr_site, builtins._fr_raised, builtins._fr_variant = records.site, records.raised, records.variant
    sys.meta_path.insert(0, _Guard(root, names))
    _fr_os.write(out, b"\nFR-RUNNER-READY\n")  # nothing of the repository has run before this line
    sys.path.insert(0, root)  # the tests import the repository, as `python -m pytest` in its root would
    report, rebound = _Report(records), _rebound
    snap = _snapshot()
    try:
        pytest.main(args, plugins=[report])
    except BaseException:  # noqa: BLE001 - whatever pytest did not catch: its report says what ran
        traceback.print_exc()
    payload = {"tests": report.tests, "finished": report.finished, "exit_status": _repr(report.exit_status),
               "tampered": rebound(snap), "records": records.by_test, "late_plugins": report.late_plugins,
               "foreign": report.foreign}
    # Serialised by repr of exact builtin values only: no module function the repository could wrap.
    _fr_seal(secret, out, _repr(payload).encode("utf-8", "backslashreplace"), result_path)
    os._exit(0)


main()
'''  # noqa: E501


@dataclass
class PytestRun:
    """One sealed pytest run (:func:`run_pytest`).

    ``report`` is the verified per-test report (empty when there is no valid seal), ``records`` what
    the grader's rewritten checks recorded per test (:mod:`envs.repo_coding.checks`), ``evidence`` is
    ``sealed``/``missing``/``forged`` (:mod:`tools_sandbox.sealed`), ``finished`` whether the pytest
    session reached its end, ``tampered`` the runner functions rebound during the run,
    ``late_plugins`` plugins registered while the session ran (by the code under test), ``ready``
    whether the runner got as far as making the repository importable (a run without it failed before
    any repository code ran: the runner's or the sandbox's failure), ``output`` pytest's own text
    (what the agent's ``run_tests`` shows).
    """

    report: dict[str, dict[str, str]] = field(default_factory=dict)
    records: dict[str, list] = field(default_factory=dict)
    evidence: str = "missing"
    finished: bool = False
    tampered: list[str] = field(default_factory=list)
    late_plugins: list[str] = field(default_factory=list)
    ready: bool = False
    output: str = ""
    status: str = ""
    timed_out: bool = False

    @property
    def trusted(self) -> bool:
        """A sealed report from a session that finished with the runner untouched."""
        return self.evidence == "sealed" and self.finished and not self.tampered and not self.late_plugins


# The runner's environment: nothing inherited; a fixed hash seed, so that the reference and the
# candidate run order sets of strings alike (their records are compared value by value).
RUNNER_ENV = "env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 PYTHONHASHSEED=0"
READY_LINE = "FR-RUNNER-READY"


def run_pytest(sb: Any, workdir: str, files: list[str], timeout: float) -> PytestRun:
    """Run ``files`` with pytest in ``workdir`` of ``sb`` through the sealed :data:`RUNNER`."""
    import ast

    from tools_sandbox.sealed import PRELUDE, run_sealed

    run_dir = f"/tmp/fr_runner_{secrets.token_hex(8)}"
    result_path = f"{run_dir}/report.json"
    sb.write_file(f"{run_dir}/runner.py", PRELUDE + RUNNER)
    argv = ["python3", "-s", "-B", f"{run_dir}/runner.py", result_path, *PYTEST_ARGS, *files]
    cmd = f"cd {shlex.quote(workdir)} && {RUNNER_ENV} " + " ".join(shlex.quote(a) for a in argv)
    run = run_sealed(sb, cmd, result_path, timeout)
    out = PytestRun(
        evidence=run.evidence,
        output=run.output().replace(READY_LINE, "").strip("\n"),
        status=run.result.status,
        timed_out=run.result.timed_out,
        ready=READY_LINE in run.result.stdout,
    )
    if run.verified and run.payload is not None:
        try:
            data = ast.literal_eval(run.payload.decode("utf-8"))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict):
            tests = data.get("tests", {})
            out.report = tests if isinstance(tests, dict) else {}
            recs = data.get("records", {})
            out.records = recs if isinstance(recs, dict) else {}
            out.finished = data.get("finished") is True
            out.tampered = list(data.get("tampered") or [])
            out.late_plugins = list(data.get("late_plugins") or [])
            for nid in data.get("foreign") or []:  # not the trusted test file's function: failed
                if isinstance(nid, str):
                    out.report[nid] = {
                        "outcome": "failed",
                        "message": "the test function is not from its file",
                    }
        else:
            out.evidence = "forged"
    return out
