"""Pull the final answer out of a model reply, the hack-resistant way.

math-verify on its own is too forgiving for RL: it searches the *whole* reply, so an unboxed
``"3 or 4"`` scores against gold ``3``, and two boxes ``\\boxed{6} \\boxed{7}`` are parsed as the
set ``{6, 7}``. A policy under optimisation pressure finds such holes quickly. So we decide here,
with plain string scanning, *which* substring is the answer, and hand only that to math-verify:

* ``"boxed"``      – the content of the **last** ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced;
* ``"answer_tag"`` – the content of the **last** ``<answer>...</answer>``;
* ``"plain"``      – the whole reply, stripped. Only for the tiny arithmetic curriculum, where a
  ~1M-parameter model replies ``"19"`` to ``"12+7="``; it is not hack-resistant for free-form math.

No answer found means no reward, whatever else the reply says.
"""

from __future__ import annotations

import re

ANSWER_FORMATS = ("boxed", "answer_tag", "plain")

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def _balanced_from(text: str, open_idx: int) -> str | None:
    """Content between the ``{`` at ``open_idx`` and its matching ``}``; None when unbalanced.

    A backslash escapes the next character, so ``\\{1,2\\}`` (a LaTeX set) does not count as braces.
    """
    depth = 0
    i = open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` in ``text`` (None when there is none).

    A trailing box that never closes (a reply cut off mid-answer) does not count, and we do not
    fall back to an earlier box: the final box is the answer, or there is no answer.
    """
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    content = _balanced_from(text, last.end() - 1)
    return content.strip() if content is not None else None


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` pair (None when there is none)."""
    matches = _TAG_RE.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str, answer_format: str = "boxed") -> str | None:
    """The final answer of ``text`` under ``answer_format`` (one of :data:`ANSWER_FORMATS`)."""
    if answer_format == "boxed":
        return last_boxed(text)
    if answer_format == "answer_tag":
        return last_answer_tag(text)
    if answer_format == "plain":
        stripped = text.strip()
        return stripped or None
    raise ValueError(f"answer_format: expected one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")


_WS_RE = re.compile(r"\s+")


def normalize_simple(s: str) -> str:
    """Cheap normal form for the exact-match fast path: no whitespace, no ``$``, no final period."""
    s = _WS_RE.sub("", s).strip("$")
    return s[:-1] if s.endswith(".") else s
