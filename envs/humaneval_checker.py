"""HumanEval's checker: the problem's ``check`` runs here, the candidate's function runs elsewhere.

This file is **stdlib only** and has two roles, like :mod:`tools_sandbox.worker`:

* run as a script (``python3 -I -B humaneval_checker.py``), it is the *checker process*: a trusted
  process on the host that loads the problem's test code (and the prompt's helper functions it
  needs) and runs ``check(candidate)``. It never imports or runs candidate code. ``candidate`` is a
  stand-in that sends each call's arguments to its parent (the env) and returns what comes back;
* imported (by :mod:`envs.humaneval`), it gives the env the *value encoding* (:func:`encode`,
  :func:`decode`) and the sandbox's side of a call (:data:`SERVER`).

Why values and not objects. A candidate that runs in the checker's process can reach the checks
(frames, ``gc``, trace functions, the builtins) or return an object whose ``__eq__`` always says
yes. Here the only thing that leaves the sandbox is **text**, decoded by :func:`decode` into plain
builtin values (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``,
``tuple``, ``dict``, ``set``, ``frozenset``) and nothing else; the test compares them with its own
code, in its own process.

The encoding is JSON in which only unambiguous forms are native: ``null``, ``true``/``false``,
integers, strings and arrays (= ``list``). Everything else is a one-key object:
``{"f": float.hex()}`` (exact, and keeps ``-0.0``, ``inf`` and ``nan``), ``{"t": [...]}`` (tuple),
``{"d": [[key, value], ...]}`` (dict, any hashable keys, in order), ``{"s": [...]}`` (set),
``{"fs": [...]}`` (frozenset), ``{"c": [real, imag]}`` (complex, as float hex) and ``{"b": base64}``
(bytes). A JSON float literal, ``NaN``/``Infinity``, an unknown key, a second key or an unhashable
key is rejected, so the decoder accepts exactly what :func:`encode` writes.

Checker protocol (JSON lines; the checker writes on a private duplicate of its stdout and reads on
stdin, and the test's own prints go to stderr):

* env -> checker, once: ``{"stub": ..., "test": ..., "entry_point": ...}``;
* checker -> env: ``{"op": "call", "args": <encoded tuple>}``; env -> checker: ``{"value": <text>}``
  (the encoded return value). When the call failed (the candidate raised, timed out, crashed or
  returned something that is not plain data) the env does not answer: it ends the checker;
* checker -> env, last: ``{"op": "done", "passed": bool, "error": str}`` (``check`` returned, or
  raised on the values), or ``{"op": "broken", "error": str}``: the checker itself could not judge
  (the test does not load, the test raised ``NameError``/``ImportError``, or it passed the candidate
  an argument that is not plain data).
"""

from __future__ import annotations

import base64
import json

_NATIVE = (type(None), bool, int, str)


# ----------------------------------------------------------------------------- the value encoding


def _enc(value: object) -> object:
    """The JSON-ready form of one plain value (exact types only: a subclass is not plain)."""
    t = type(value)
    if t in _NATIVE:
        return value
    if t is float:
        return {"f": value.hex()}  # type: ignore[attr-defined]
    if t is list:
        return [_enc(v) for v in value]  # type: ignore[attr-defined]
    if t is tuple:
        return {"t": [_enc(v) for v in value]}  # type: ignore[attr-defined]
    if t is dict:
        return {"d": [[_enc(k), _enc(v)] for k, v in value.items()]}  # type: ignore[attr-defined]
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [_enc(v) for v in value]}  # type: ignore[attr-defined]
    if t is complex:
        return {"c": [value.real.hex(), value.imag.hex()]}  # type: ignore[attr-defined]
    if t is bytes:
        return {"b": base64.b64encode(value).decode("ascii")}  # type: ignore[arg-type]
    raise TypeError(f"not plain data: a {t.__name__} object")


def encode(value: object) -> str:
    """``value`` as one line of JSON text (raises TypeError when it is not plain data)."""
    return json.dumps(_enc(value), separators=(",", ":"))


def _reject(token: str) -> object:
    raise ValueError(f"not plain data: {token!r} is not part of the encoding")


def _float(text: object) -> float:
    if type(text) is not str:
        raise ValueError("not plain data: a float must be hex text")
    return float.fromhex(text)


def _items(node: object) -> list:
    if type(node) is not list:
        raise ValueError("not plain data: a container's items must be an array")
    return [_dec(v) for v in node]  # type: ignore[union-attr]


def _dec(node: object) -> object:
    """The value of one parsed JSON node (see the module docstring for the forms)."""
    t = type(node)
    if t in _NATIVE:
        return node
    if t is list:
        return _items(node)
    if t is not dict or len(node) != 1:  # type: ignore[arg-type]
        raise ValueError(f"not plain data: a {t.__name__} node")
    ((tag, body),) = node.items()  # type: ignore[union-attr]
    if tag == "f":
        return _float(body)
    if tag == "t":
        return tuple(_items(body))
    if tag == "s":
        return set(_items(body))
    if tag == "fs":
        return frozenset(_items(body))
    if tag == "d":
        pairs = _items(body)
        if any(type(p) is not list or len(p) != 2 for p in pairs):
            raise ValueError("not plain data: a dict item must be a [key, value] pair")
        return {k: v for k, v in pairs}
    if tag == "c":
        parts = body if type(body) is list and len(body) == 2 else None
        if parts is None:
            raise ValueError("not plain data: a complex must be [real, imag]")
        return complex(_float(parts[0]), _float(parts[1]))
    if tag == "b" and type(body) is str:
        return base64.b64decode(body.encode("ascii"), validate=True)
    raise ValueError(f"not plain data: unknown form {str(tag)[:20]!r}")


def decode(text: str | bytes) -> object:
    """The plain value ``text`` encodes; ValueError for anything else (a float literal, ``NaN``, an
    unknown form, an unhashable dict key or set item, nesting too deep to parse)."""
    try:
        node = json.loads(text, parse_float=_reject, parse_constant=_reject)
        return _dec(node)
    except (ValueError, TypeError, RecursionError, UnicodeError, MemoryError) as e:
        # TypeError: an unhashable key or set item; RecursionError: absurd nesting.
        raise ValueError(f"{type(e).__name__}: {e}"[:300]) from None


# ----------------------------------------------------------------------------- the sandbox's side

# Run once in the sandbox's Python worker (its persistent namespace), before the candidate's program.
# It is the candidate's own side: nothing in it is trusted. Its only job is to turn the arguments it
# is sent into values, call the function and print the result's encoding as the call's whole stdout;
# the host accepts that text only through decode().
SERVER = r"""
def _fr_server():
    import base64, json, os, sys

    def dec(node):
        if isinstance(node, list):
            return [dec(v) for v in node]
        if not isinstance(node, dict):
            return node
        ((tag, body),) = node.items()
        if tag == "f":
            return float.fromhex(body)
        if tag == "t":
            return tuple(dec(v) for v in body)
        if tag == "d":
            return {dec(k): dec(v) for k, v in body}
        if tag in ("s", "fs"):
            return (set if tag == "s" else frozenset)(dec(v) for v in body)
        if tag == "c":
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        return base64.b64decode(body)

    def enc(value):
        t = type(value)
        if value is None or t in (bool, int, str):
            return value
        if t is float:
            return {"f": value.hex()}
        if t is list:
            return [enc(v) for v in value]
        if t is tuple:
            return {"t": [enc(v) for v in value]}
        if t is dict:
            return {"d": [[enc(k), enc(v)] for k, v in value.items()]}
        if t in (set, frozenset):
            return {"s" if t is set else "fs": [enc(v) for v in value]}
        if t is complex:
            return {"c": [value.real.hex(), value.imag.hex()]}
        if t is bytes:
            return {"b": base64.b64encode(value).decode("ascii")}
        raise TypeError("the function returned a %s object; only plain data is graded" % t.__name__)

    def load(source, entry):
        import linecache
        linecache.cache["solution.py"] = (len(source), None, source.splitlines(True), "solution.py")
        namespace = globals()

        def call(payload):
            args = dec(json.loads(payload))
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(2, 1)  # the function's own prints go to stderr: stdout carries the value only
            try:
                value = namespace[entry](*args)
            finally:
                try:
                    sys.stdout.flush()
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
            data = json.dumps(enc(value), separators=(",", ":")).encode()
            while data:
                data = data[os.write(1, data):]

        namespace["_fr_call"] = call
        exec(compile(source, "solution.py", "exec"), namespace)

    return load


_fr_load = _fr_server()
del _fr_server
"""


# ----------------------------------------------------------------------------- the checker process


class _Broken(BaseException):
    """The checker cannot judge (not the candidate's doing). A BaseException, so the test's own
    ``except Exception`` cannot swallow it; it is also recorded, in case a bare ``except`` does."""


def _load_check(spec: dict, candidate: object) -> object:
    """The test's ``check``, compiled in a namespace of its own: the prompt's helpers (the entry
    point stubbed) and the test code. ``candidate`` is bound under the entry point's name too (a
    test may call the function by its name)."""
    namespace: dict = {"__name__": "__fr_test__"}
    if spec.get("stub"):
        exec(compile(spec["stub"], "<prompt>", "exec"), namespace)
    exec(compile(spec["test"], "<test>", "exec"), namespace)
    namespace[spec["entry_point"]] = candidate
    return namespace["check"]


def _judge(check: object, candidate: object, broken: list[str]) -> dict:
    """Run ``check(candidate)``; the checker's last message. ``done`` when the test ran to its end
    (``passed``) or stopped on the values (an assert, a ``TypeError`` on a wrong type...);
    ``broken`` when the checker could not judge: a call it could not send (``broken``), or a test
    that raises ``NameError``/``ImportError``, which no value can cause (``UnboundLocalError`` can:
    a loop over an empty result)."""
    import traceback

    try:
        check(candidate)  # type: ignore[operator]
    except BaseException as e:  # noqa: BLE001 - whatever the test raises ends the judgement
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # from the test on
        trace = "".join(traceback.format_exception(type(e), e, tb))[-1500:]
        if broken or isinstance(e, _Broken):
            return {"op": "broken", "error": broken[0] if broken else str(e)}
        if isinstance(e, (NameError, ImportError, SyntaxError)) and not isinstance(e, UnboundLocalError):
            return {"op": "broken", "error": "the test is broken: " + trace}
        return {"op": "done", "passed": False, "error": trace}
    if broken:  # the test swallowed a _Broken with a bare except
        return {"op": "broken", "error": broken[0]}
    return {"op": "done", "passed": True, "error": ""}


def main() -> None:
    import os
    import sys
    import traceback

    out = os.dup(1)
    os.dup2(2, 1)  # the test's own prints must not mix with the protocol
    stdin = sys.stdin.buffer

    def send(msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode("ascii")
        while data:
            data = data[os.write(out, data) :]

    broken: list[str] = []

    def candidate(*args: object, **kwargs: object) -> object:
        if kwargs:
            broken.append(
                f"the test passed keyword arguments {sorted(kwargs)}; only positional ones are sent"
            )
            raise _Broken(broken[-1])
        try:
            payload = encode(args)
        except TypeError as e:
            broken.append(f"the test passed an argument that is {e}")
            raise _Broken(broken[-1]) from None
        send({"op": "call", "args": payload})
        line = stdin.readline()
        if not line:
            raise _Broken("the env closed the channel")
        return decode(json.loads(line)["value"])

    spec = json.loads(stdin.readline())
    try:
        check = _load_check(spec, candidate)
    except BaseException:  # noqa: BLE001 - the test itself does not load
        send({"op": "broken", "error": "the test does not load: " + traceback.format_exc(limit=-2)[-1500:]})
        return
    send(_judge(check, candidate, broken))


if __name__ == "__main__":
    main()
