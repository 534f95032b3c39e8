"""Hermes/Qwen-style tool calls, shared by every tool env (PythonTool-v0, RepoCoding-v0).

A reply calls tools as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. This module
finds the calls and decodes their JSON; each env passes a ``check(name, arguments)`` that validates
the call against its own tools and returns what the env needs, or ``{"error": why}``. Every problem
becomes an ``{"error": why}`` entry, so a malformed call gets an explanation and the episode goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

Check = Callable[[str, dict[str, Any]], dict[str, Any]]


def parse_tool_calls(text: str, check: Check) -> list[dict[str, Any]]:
    """Every ``<tool_call>`` of ``text`` in order, decoded and passed through ``check``.

    ``arguments`` may be an object or a JSON string holding one (some models emit the latter).
    An opening ``<tool_call>`` without its closing tag is reported as an error too.
    """
    calls = [_decode(m.group(1), check) for m in CALL_RE.finditer(text)]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>") :] if calls else text
    if "<tool_call>" in tail:
        calls.append({"error": "a <tool_call> was opened but never closed with </tool_call>"})
    return calls


def _decode(body: str, check: Check) -> dict[str, Any]:
    try:
        call = json.loads(body.strip(), strict=False)  # tolerate raw newlines inside strings
    except json.JSONDecodeError as e:
        return {"error": f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"}
    if not isinstance(call, dict) or "name" not in call:
        return {"error": 'a tool call must be a JSON object with "name" and "arguments"'}
    args = call.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args, strict=False)
        except json.JSONDecodeError:
            return {"error": '"arguments" must be a JSON object'}
    if not isinstance(args, dict):
        return {"error": '"arguments" must be a JSON object'}
    return check(str(call["name"]), args)


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the form :func:`parse_tool_calls` reads (what a scripted expert writes)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
