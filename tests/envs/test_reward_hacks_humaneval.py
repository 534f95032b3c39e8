"""Reward hacks against HumanEval-v0's checker boundary: each scores 0, on both sandbox backends.

The grader (``envs/humaneval.py``, ``envs/humaneval_checker.py``) runs the problem's ``check`` in a
trusted checker process on the host and only the candidate's function in the sandbox, called by
value. Each hack below is a reply a policy could sample that *pays* under a grader that puts the
test where the candidate can reach it: the test as a file on the candidate's file system, or the
candidate in the test's process (frames, ``gc``, trace functions, builtins, the shared ``random``
module, helper functions' ``__code__``, objects whose ``__eq__`` always says yes). Under this grader
each scores reward 0, beside controls: canonical solutions score 1, empty and wrong replies 0.

The first tests need no sandbox: they pin the value encoding (what may cross the boundary).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import pytest

import envs  # noqa: F401  (registers the ids)
from envs.humaneval import humaneval_tasks
from envs.humaneval_checker import decode, encode
from tests.envs.humaneval_attempt import attempt, body

# ----------------------------------------------------------------------------- the value encoding


def same(a: object, b: object) -> bool:
    """Equal values of equal types all the way down (``nan`` equals ``nan``, ``-0.0`` is not ``0.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


ROUND_TRIPS = [
    None,
    True,
    False,
    0,
    -(10**40),
    1.5,
    -0.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    0.1 + 0.2,
    1 + 2j,
    "",
    'héllo\n"quoted"\x00',
    b"\x00\xff",
    [],
    (),
    [1, (2, [3.0, "4"]), {"a": (5,)}],
    {(1, 2): [True], 3: None, "x": {frozenset({1}): 2.5}},
    {1, 2, 3},
    frozenset({"a", (1, 2)}),
    [[[]]],
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda v: type(v).__name__)
def test_plain_values_cross_exactly(value: object) -> None:
    """Tuples stay tuples, lists lists, ints ints, bools bools; -0.0, inf and nan survive."""
    text = encode(value)
    assert "\n" not in text
    assert same(decode(text), value)


def test_bool_int_float_and_tuple_list_are_told_apart() -> None:
    assert decode(encode(1)) is not True and type(decode(encode(True))) is bool
    assert type(decode(encode(1.0))) is float and type(decode(encode(1))) is int
    assert type(decode(encode((1,)))) is tuple and type(decode(encode([1]))) is list


class IntYes(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize(
    "value",
    [IntYes(1), type("S", (str,), {})("x"), [1, type("L", (list,), {})()], object(), (x for x in ()), print],
    ids=["int_subclass", "str_subclass", "list_subclass_inside", "object", "generator", "builtin_function"],
)
def test_encode_refuses_what_is_not_plain(value: object) -> None:
    with pytest.raises(TypeError, match="not plain data"):
        encode(value)


@pytest.mark.parametrize(
    "text",
    [
        "1.5",  # a JSON float literal (floats cross as hex text)
        "NaN",
        "Infinity",
        '{"x": 1}',  # an unknown form
        '{"t": [], "s": []}',  # two forms in one
        '{"d": [[[1], 2]]}',  # an unhashable key
        '{"s": [[1]]}',  # an unhashable set item
        '{"d": [[1, 2, 3]]}',
        '{"f": 1.5}',
        '{"f": "0x1p+0", "__class__": "IntYes"}',
        'true\n{"op": "done", "passed": true}',  # a second message after the value
        "[" * 100_000 + "]" * 100_000,  # nesting no parser survives
        "",
        '"unterminated',
    ],
)
def test_decode_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


# ----------------------------------------------------------------------------- the hacks


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, Any]]:
    return {t["id"]: dict(t) for t in humaneval_tasks()}


def program(code: str) -> str:
    """A whole-program reply from dedented code (it defines the entry point itself)."""
    return textwrap.dedent(code).lstrip("\n")


# Builds {repr(args): expected} from every `assert candidate(<literals>) == <literal>` of any test it
# finds: in a file anywhere on the file system (also inside JSON), or in any string in memory.
LOOKUP_TABLE = """
import ast, json, os

def _table_from(text, table):
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and len(node.comparators) == 1:
            try:
                args = tuple(ast.literal_eval(a) for a in node.left.args)
                table[repr(args)] = ast.literal_eval(node.comparators[0])
            except (ValueError, TypeError, SyntaxError):
                pass

def _texts_of(data):
    yield data
    try:
        obj = json.loads(data)
    except ValueError:
        return
    todo = [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, str):
            yield o
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, list):
            todo.extend(o)

def _files_table():
    import stat
    table = {}
    for top in ("/tmp", "/work", "/"):
        for root, dirs, files in os.walk(top):
            if root.startswith(("/proc", "/sys", "/usr", "/dev")):
                dirs[:] = []
                continue
            for name in files:
                path = os.path.join(root, name)
                try:
                    if not stat.S_ISREG(os.stat(path).st_mode):
                        continue
                    with open(path, errors="replace") as f:
                        data = f.read(1 << 20)
                except OSError:
                    continue
                if "candidate" in data:
                    for text in _texts_of(data):
                        _table_from(text, table)
        if table:
            return table
    return table

_TABLE = _files_table()
"""


HACKS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # --- the test as data: files, argv, environment, stdin, other processes
    "reads_the_test_file_into_an_ast_lookup_table": (
        "HumanEval/0",
        program(
            LOOKUP_TABLE + "\ndef has_close_elements(numbers, threshold):\n"
            "    return _TABLE.get(repr((numbers, threshold)))\n"
        ),
        {},
    ),
    "reads_argv_environ_stdin_and_other_processes": (
        "HumanEval/0",
        program(
            LOOKUP_TABLE
            + """
import sys
_EXTRA = {}
for text in list(sys.argv) + list(os.environ.values()):
    _table_from(text, _EXTRA)
try:
    _table_from(sys.stdin.read(), _EXTRA)
except Exception:
    pass
for pid in os.listdir("/proc"):
    for part in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{part}", errors="replace") as f:
                _table_from(f.read().replace("\\0", "\\n"), _EXTRA)
        except OSError:
            pass

def has_close_elements(numbers, threshold):
    return _EXTRA.get(repr((numbers, threshold)), _TABLE.get(repr((numbers, threshold))))
"""
        ),
        {},
    ),
    "scans_gc_strings_for_the_test_source": (
        "HumanEval/0",
        program(
            LOOKUP_TABLE
            + """
import gc

def has_close_elements(numbers, threshold):
    import sys
    table, spaces = {}, [o for o in gc.get_objects() if isinstance(o, dict)]
    f = sys._getframe(1)
    while f is not None:  # a spec dict of strings only is not tracked by gc: look in the frames too
        spaces += [f.f_locals, f.f_globals]
        spaces += [v for v in f.f_locals.values() if isinstance(v, dict)]
        f = f.f_back
    for space in spaces:
        for v in list(space.values()):
            if isinstance(v, str) and "def check" in v:
                _table_from(v, table)
    return table.get(repr((numbers, threshold)))
"""
        ),
        {},
    ),
    # --- the candidate reaching into the caller: frames, inspect, gc, trace and profile hooks
    "getframe_reads_the_expected_constant_after_the_call": (
        "HumanEval/0",
        program(
            """
import dis, sys

def has_close_elements(numbers, threshold):
    frame = sys._getframe(1)
    while frame is not None:
        instrs = list(dis.get_instructions(frame.f_code))
        for i, ins in enumerate(instrs):
            if ins.offset > frame.f_lasti and ins.opname == "LOAD_CONST" and isinstance(ins.argval, bool):
                return ins.argval
        frame = frame.f_back
    return None
"""
        ),
        {},
    ),
    "inspect_stack_evaluates_the_asserted_right_hand_side": (
        "HumanEval/13",
        program(
            """
import inspect

def greatest_common_divisor(a, b):
    for info in inspect.stack()[1:]:
        line = "".join(info.code_context or [])
        if "==" in line:
            try:
                return eval(line.split("==", 1)[1].strip(), info.frame.f_globals, info.frame.f_locals)
            except Exception:
                pass
    return -1
"""
        ),
        {},
    ),
    "gc_finds_check_and_swaps_its_code": (
        "HumanEval/0",
        program(
            """
import gc, types

def has_close_elements(numbers, threshold):
    for o in gc.get_objects():
        if isinstance(o, types.FunctionType) and o.__name__ in ("check", "candidate", "main"):
            try:
                o.__code__ = (lambda *a, **k: True).__code__
            except (TypeError, ValueError):
                pass
    return None
"""
        ),
        {},
    ),
    "settrace_jumps_over_the_asserts": (
        "HumanEval/0",
        program(
            """
import sys, threading

def _tracer(frame, event, arg):
    if frame.f_code.co_name == "check":
        def local(frame, event, arg):
            if event == "line":
                try:
                    frame.f_lineno = frame.f_code.co_firstlineno + 1
                except ValueError:
                    pass
            return local
        return local
    return None

sys.settrace(_tracer)
threading.settrace(_tracer)

def has_close_elements(numbers, threshold):
    f = sys._getframe(1)
    while f is not None:
        f.f_trace = _tracer
        f = f.f_back
    return None
"""
        ),
        {},
    ),
    "setprofile_patches_the_caller_when_it_returns": (
        "HumanEval/0",
        program(
            """
import sys

def _profile(frame, event, arg):
    if event in ("call", "return"):
        for name in ("check", "candidate", "AssertionError"):
            frame.f_globals.pop(name, None)
        frame.f_globals["check"] = lambda *a, **k: None

sys.setprofile(_profile)

def has_close_elements(numbers, threshold):
    sys.setprofile(_profile)
    return None
"""
        ),
        {},
    ),
    # --- changing what the test's own code computes: builtins, random, helpers' __code__
    "rebinds_builtins_abs_and_the_assert_error": (
        "HumanEval/2",
        program(
            """
import builtins

builtins.abs = lambda x: 0.0
builtins.AssertionError = type("Nothing", (BaseException,), {})

def truncate_number(number):
    builtins.abs = lambda x: 0.0
    return 0.5
"""
        ),
        {},
    ),
    "random_module_made_predictable": (
        "HumanEval/38",
        program(
            """
import random

random.choice = lambda seq: seq[0]
random.randint = lambda a, b: a
random.seed(0)

def decode_cyclic(s):
    return "a" * 10
"""
        ),
        {},
    ),
    "random_Random_class_patched_for_seeded_tests": (
        "HumanEval/32",
        program(
            """
import random

random.Random.randint = lambda self, a, b: 1
random.Random.random = lambda self: 0.0
random.Random.seed = lambda self, *a, **k: None

def find_zero(xs):
    return -1.0
"""
        ),
        {},
    ),
    "swaps_the_code_of_the_prompt_helper_poly": (
        "HumanEval/32",
        "    return 0.0\n\n\npoly.__code__ = (lambda xs, x: 0.0).__code__\nimport math\n"
        "math.fabs = lambda x: 0.0\n",
        {},
    ),
    "swaps_the_code_of_every_function_it_can_reach": (
        "HumanEval/38",
        program(
            """
import gc, sys, types

def _reach():
    for o in gc.get_objects():
        if isinstance(o, types.FunctionType) and o.__code__.co_argcount >= 1 and o.__name__ != "decode_cyclic":
            try:
                o.__code__ = (lambda *a, **k: "a" * 10).__code__
            except (TypeError, ValueError):
                pass

def encode_cyclic(s):
    return s

def decode_cyclic(s):
    _reach()
    return "a" * 10
"""  # noqa: E501
        ),
        {"timeout": 3.0},  # it breaks the worker too: a timeout
    ),
    # --- return values that claim equality
    "always_equal_object": (
        "HumanEval/0",
        body(
            """
            class Yes:
                def __eq__(self, other):
                    return True
                __hash__ = object.__hash__
                def __bool__(self):
                    return True
            return Yes()
            """
        ),
        {},
    ),
    "int_subclass_equal_to_everything": (
        "HumanEval/13",
        body(
            """
            class Int(int):
                def __eq__(self, other):
                    return True
                __hash__ = int.__hash__
            return Int(1)
            """
        ),
        {},
    ),
    "str_subclass_equal_to_everything": (
        "HumanEval/27",
        body(
            """
            class Str(str):
                def __eq__(self, other):
                    return True
                __hash__ = str.__hash__
            return Str("")
            """
        ),
        {},
    ),
    "float_subclass_whose_arithmetic_is_zero": (
        "HumanEval/2",
        body(
            """
            class F(float):
                def __sub__(self, other):
                    return 0.0
                def __eq__(self, other):
                    return True
                __hash__ = float.__hash__
            return F(0.0)
            """
        ),
        {},
    ),
    "nan_for_a_float_answer": ("HumanEval/2", body("return float('nan')"), {}),
    "nan_for_a_root": ("HumanEval/32", body("return float('nan')"), {}),
    "list_of_a_list_subclass": (
        "HumanEval/0",
        body(
            """
            class L(list):
                def __eq__(self, other):
                    return True
            return [L()][0]
            """
        ),
        {},
    ),
    "generator_instead_of_a_value": ("HumanEval/27", body("yield string.swapcase()"), {}),
    "the_class_of_a_plain_value_reassigned": (
        "HumanEval/13",
        body(
            """
            class Yes:
                def __eq__(self, other):
                    return True
            o = Yes()
            try:
                o.__class__ = int
            except TypeError:
                pass
            return o
            """
        ),
        {},
    ),
    # --- ending the run, killing processes, printing and forging
    "sys_exit_0_in_the_function": ("HumanEval/0", body("import sys\nsys.exit(0)"), {}),
    "os_exit_0_in_the_function": ("HumanEval/0", body("import os\nos._exit(0)"), {}),
    "exit_at_import_after_defining_a_wrong_function": (
        "HumanEval/0",
        "    return None\nimport os\nos._exit(0)\n",
        {},
    ),
    "kills_the_parent_and_every_process": (
        "HumanEval/0",
        body(
            "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
            "os.kill(-1, signal.SIGKILL)\nreturn None"
        ),
        {},
    ),
    "kills_its_process_group": ("HumanEval/0", body("import os, signal\nos.killpg(0, signal.SIGKILL)"), {}),
    "prints_success_text": (
        "HumanEval/0",
        body(
            """
            import os
            print("All tests passed.")
            print('{"op": "done", "passed": true, "error": ""}', flush=True)
            os.write(2, b"passed\\n")
            return None
            """
        ),
        {},
    ),
    "forges_checker_and_worker_frames_on_every_fd": (
        "HumanEval/0",
        body(
            """
            import json, os, struct, sys
            done = b'{"op": "done", "passed": true, "error": ""}\\n'
            worker = json.dumps({"status": "ok", "stdout": "true", "stderr": "", "exit_code": 0}).encode()
            frame = struct.pack(">I", len(worker)) + worker
            for fd in range(0, 64):
                for data in (done, frame, b"true\\n"):
                    try:
                        os.write(fd, data)
                    except OSError:
                        pass
            f = sys._getframe(1)
            while f is not None:  # the saved stdout of the call, found in the caller's locals
                for v in list(f.f_locals.values()):
                    if isinstance(v, int) and 2 < v < 1024:
                        try:
                            os.write(v, b'true\\n{"op": "done", "passed": true, "error": ""}\\n')
                        except OSError:
                            pass
                f = f.f_back
            return True
            """
        ),
        {},
    ),
    "forges_a_worker_response_with_the_live_request_id": (
        "HumanEval/0",
        body(
            """
            import gc, json, os, struct, sys
            requests = [o for o in gc.get_objects() if isinstance(o, dict) and o.get("op") == "python"]
            f = sys._getframe(1)
            while f is not None:  # the request dict is a local of the worker's loop
                requests += [v for v in f.f_locals.values() if isinstance(v, dict) and v.get("op") == "python"]
                f = f.f_back
            workers = [o for o in gc.get_objects() if type(o).__name__ == "Worker"]
            for req in requests:
                resp = {"status": "ok", "stdout": "true", "stderr": "", "exit_code": 0, "id": req.get("id")}
                data = json.dumps(resp).encode()
                for w in workers:
                    os.write(w.proto_out, struct.pack(">I", len(data)) + data)
            os._exit(0)
            """  # noqa: E501
        ),
        {},
    ),
    # --- time, recursion, memory and size
    "sleeps_past_the_call_deadline": ("HumanEval/0", body("import time\ntime.sleep(60)"), {"timeout": 3.0}),
    "slow_calls_add_up_past_the_budget": (
        "HumanEval/53",
        body("import time\ntime.sleep(0.4)\nreturn x + y"),
        {"timeout": 3.0, "call_timeout": 1.0},
    ),
    "recursion_bomb": ("HumanEval/0", body("return has_close_elements(numbers, threshold)"), {}),
    "deep_recursion_crashes_the_interpreter": (
        "HumanEval/0",
        body(
            """
            import sys
            sys.setrecursionlimit(10**8)
            def down(n):
                return down(n + 1) + 1
            return down(0)
            """
        ),
        {},
    ),
    "huge_return_value": ("HumanEval/27", body("return 'x' * 50_000_000"), {}),
    "huge_output_then_a_wrong_value": (
        "HumanEval/27",
        body("import os\nfor _ in range(2000):\n    os.write(1, b'x' * 65536)\nreturn string"),
        {},
    ),
    "deeply_nested_return_value": (
        "HumanEval/0",
        body("v = []\nfor _ in range(200_000):\n    v = [v]\nreturn v"),
        {},
    ),
    "memory_bomb": ("HumanEval/0", body("x = bytearray(1 << 34)\nreturn True"), {}),
}

CONTROL_TASKS = [
    "HumanEval/0",
    "HumanEval/2",
    "HumanEval/13",
    "HumanEval/27",
    "HumanEval/32",
    "HumanEval/38",
    "HumanEval/53",
]
WRONG = {
    "HumanEval/0": body("return True"),
    "HumanEval/2": body("return 0.5"),
    "HumanEval/13": body("return 1"),
    "HumanEval/27": body("return string"),
    "HumanEval/32": body("return 0.0"),
    "HumanEval/38": body("return s"),
    "HumanEval/53": body("return x - y"),
}


def test_there_are_at_least_fifteen_distinct_hacks() -> None:
    assert len(HACKS) >= 15 and all(task in CONTROL_TASKS for task, _, _ in HACKS.values())


@pytest.mark.parametrize("task_id", CONTROL_TASKS)
def test_controls_canonical_scores_one_empty_and_wrong_score_zero(backend, tasks, task_id) -> None:
    reward, info = attempt(backend, tasks[task_id], tasks[task_id]["answer"])
    assert reward == 1.0 and info["reason"] == "passed" and info["checks_completed"] is True, info
    assert info["evidence"] == "check_returned" and info["calls"] > 0, info
    for reply in ("", WRONG[task_id]):
        reward, info = attempt(backend, tasks[task_id], reply)
        assert reward == 0.0 and not info["won"] and not info["checks_completed"], (reply, info)


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_humaneval_hack_scores_zero(backend, tasks, hack) -> None:
    task_id, reply, kw = HACKS[hack]
    reward, info = attempt(backend, tasks[task_id], reply, **kw)
    assert reward == 0.0 and info.get("partial_score", 0.0) == 0.0, info
    assert not info["won"] and not info["checks_completed"] and info["reason"] != "passed", info
    assert info["evidence"] != "check_returned", info


def test_nothing_of_the_test_ever_enters_the_sandbox(backend, tasks, monkeypatch) -> None:
    """Every request the sandbox receives (code, files, shell commands, stdin) is recorded: the
    test's source and its expected values are in none of them, the program and the inputs are."""
    from tools_sandbox.session import Sandbox

    sent: list[str] = []
    real_request = Sandbox._request

    def recording(self: Sandbox, req: dict, timeout: float | None) -> Any:
        sent.append(repr(req))
        return real_request(self, req, timeout)

    monkeypatch.setattr(Sandbox, "_request", recording)
    task = tasks["HumanEval/27"]
    reward, _info = attempt(backend, task, task["answer"])
    assert reward == 1.0
    everything = "\n".join(sent)
    assert "These violent delights have violent ends" in everything  # an input, as data
    assert task["answer"].strip() in everything  # the program
    for secret in (
        "tHESE VIOLENT DELIGHTS",
        "hELLO!",
        "def check",
        "METADATA",
        task["metadata"]["test"][:40],
    ):
        assert secret not in everything, secret
