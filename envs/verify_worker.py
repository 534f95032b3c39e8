"""The worker process behind :class:`envs.verifier.VerifierPool` (run as ``python -m envs.verify_worker``).

Protocol: one JSON object per line on stdin ``{"gold": str, "pred": str, "t": seconds}`` (and
optionally ``"spans"``: the prompt's math spans, see :func:`_restates`), one JSON
line back on stdout ``{"ok": bool, "reason": str, "phase": str}``, where ``phase`` says which part
of the check was running when it ended (``gold`` parsing the trusted gold, ``pred`` parsing the
answer, ``verify`` comparing them): a gold that cannot be parsed in time is the grader's failure,
an answer that cannot be is the answer's. The worker first prints ``{"ready": true}``
once math-verify is imported, so the parent never charges import time to a check's deadline.

Why a separate process: math-verify (through sympy) can run for minutes on an expression like
``9^{9^{9^{9}}}``, and its own timeouts use ``signal.alarm``, which only works in a main thread.
Here we *are* a main thread, so we set one alarm for the whole check (both parses and the
comparison) and raise a ``BaseException`` the library cannot swallow. Work stuck inside C code
never sees the signal; for that the parent kills this process at its hard deadline.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

_GOLD_CACHE_SIZE = 4096


class _Deadline(BaseException):
    """Raised by the alarm handler; a BaseException so math-verify's ``except Exception`` lets it pass."""


def _on_alarm(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise _Deadline


def _wrap(answer: str) -> str:
    # One box around the already-extracted answer: math-verify's LaTeX extractor then takes the
    # whole string as a single expression (a set only when the answer itself lists several values).
    return "\\boxed{" + answer + "}"


def _parsed(text: str, cache: dict[str, Any]) -> Any:
    """math-verify's parse of trusted text (a gold or a prompt span), cached per worker."""
    from math_verify import parse

    found = cache.get(text)
    if found is None:
        found = parse(_wrap(text), parsing_timeout=None)  # type: ignore[arg-type]
        if len(cache) >= _GOLD_CACHE_SIZE:
            cache.clear()
        cache[text] = found
    return found


def _shapes(parsed: Any) -> set[str]:
    """The printed forms of the sympy objects of a parse. SymPy prints the terms of a sum or product
    in a canonical order, and math-verify parses without evaluating, so ``(1+x)^2`` and ``(x+1)^2``
    print alike while ``x^2+2x+1``, ``x+x`` and ``2x`` each print differently."""
    return {str(e) for e in parsed if not isinstance(e, str)}


def _restates(gold_parsed: Any, pred_parsed: Any, spans: list[str], cache: dict[str, Any]) -> bool:
    """Whether an answer equal to the gold is, up to the order of terms, an expression of the
    prompt's math spans and not the gold's own shape (``(1+x)^2`` for "Expand $(x+1)^2$")."""
    answer = _shapes(pred_parsed)
    if not answer or answer & _shapes(gold_parsed):
        return False
    return any(answer & _shapes(_parsed(span, cache)) for span in spans)


def _check(
    gold: str, pred: str, gold_cache: dict[str, Any], phase: list[str], spans: list[str] | None = None
) -> dict[str, Any]:
    """Parse both sides and compare; ``phase[0]`` names the part running (read after a deadline)."""
    from math_verify import parse, verify

    phase[0] = "gold"
    g = _parsed(gold, gold_cache)
    if spans:
        for span in spans:  # trusted text: parsed (and cached) in the gold's phase
            _parsed(span, gold_cache)
    if not g:
        return {"ok": False, "reason": "gold_unparsable"}
    phase[0] = "pred"
    p = parse(_wrap(pred), parsing_timeout=None)  # type: ignore[arg-type]
    if not p:
        return {"ok": False, "reason": "unparsable"}
    phase[0] = "verify"
    ok = bool(verify(g, p, timeout_seconds=None))  # type: ignore[arg-type]
    if ok and spans and _restates(g, p, spans, gold_cache):
        return {"ok": False, "reason": "restated"}
    return {"ok": ok, "reason": "correct" if ok else "wrong"}


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)  # math-verify logs every timeout; the reason goes back to the parent
    import math_verify  # noqa: F401  (import before saying ready)

    gold_cache: dict[str, Any] = {}
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold, pred, budget = str(req["gold"]), str(req["pred"]), float(req["t"])
            spans = [str(x) for x in req.get("spans") or []]
        except (ValueError, KeyError, TypeError) as e:
            out.write(json.dumps({"ok": False, "reason": f"verifier_error: bad request ({e})"}) + "\n")
            out.flush()
            continue
        result: dict[str, Any]
        phase = ["gold"]
        try:
            signal.setitimer(signal.ITIMER_REAL, max(budget, 0.01))
            try:
                result = _check(gold, pred, gold_cache, phase, spans)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Deadline:
            result = {"ok": False, "reason": "timeout"}
        except Exception as e:  # noqa: BLE001 - a verifier crash says why; the caller decides whose fault
            result = {"ok": False, "reason": f"verifier_error: {type(e).__name__}: {e}"[:300]}
        result["phase"] = phase[0]
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
