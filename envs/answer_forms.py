"""What an answer must look like to be paid: the gold's form, not just the gold's value.

math-verify decides whether two strings denote *equal values*. An RL policy learns quickly that this
is not the same as having *done the work*: for the task ``22+48`` the answer ``\\boxed{22+48}``
denotes 70, and so would ``2*35`` or the question copied back. A word gold is worse: math-verify
reads ``listen`` as the product ``l*i*s*t*e*n``, so the anagram ``silent`` equals it. So before (or
instead of) asking math-verify, a gold is sorted into one of three kinds, and each kind states what
an answer must be:

* **number** (``70``, ``-3``, ``0.5``, ``1/2``, ``\\frac{1}{2}``, ``50\\%``, ``x=3``, ``5\\text{ cm}``):
  the answer must be a *number literal* (see :func:`parse_number`) with the same exact value, possibly
  as the last side of one equality (``x = 70``, ``22+48 = 70``: the value is stated). An
  expression that evaluates to it (``22+48``, ``2*35``, ``70+0``, ``9^{9^9}``) is not a number
  literal and is never paid, whatever it equals. Three literal forms carry an operation: a fraction
  (``140/2``, ``\\frac{6}{2}``), a mixed number (``2\\frac{1}{4}``) and a power of ten (``7e1``,
  ``10^{3}``). They are accepted as numbers (writing ``140/2`` for ``22+48`` needs 70 already),
  except when they restate the question and are not the gold as written
  (:func:`restates_question`): a fraction whose value is the ratio of two numbers of the prompt
  (``140/2`` or ``280/4`` for "What is 140 divided by 2?"), a power whose mantissa the prompt gives.
* **text** (``listen``, ``no solution``, ``Alice``): compared as normalized strings
  (:func:`normalize_text`: Unicode NFKC, case-folded, whitespace collapsed, a ``\\text{}`` wrapper,
  ``$`` and a final period dropped). Case and spacing carry no information a word answer could
  cheat with: no change of case or spacing turns one word into another.
* **math** (``\\sqrt{2}/2``, ``x^2+2x+1``, ``(0,\\infty)``, ``\\{1,2\\}``): equal value per
  math-verify, since an equivalent form is a fair answer there (``(x+1)^2`` for ``x^2+2x+1``); but
  an answer that copies the prompt is refused unless it is the gold: a piece of the prompt's text
  (:func:`echoes_prompt`, after removing spaces and ``\\left``/``\\right``), or one of its math spans
  up to the order of terms (:func:`math_spans`, compared by the verifier worker).

Only ASCII digits count as digits: an answer written in other scripts' digits (``٧٠``, ``７０``) is
not a number literal. The prompt's numbers are read after NFKC, so they are found whatever digits
the prompt used.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

# ---------------------------------------------------------------------------------------- numbers


def _words(text: str) -> frozenset[str]:
    """A set of words written as one space-separated string."""
    return frozenset(text.split())


_INT = r"(?:[1-9][0-9]{0,2}(?:,[0-9]{3})+|[0-9]+)"  # 1000 or 1,000 (commas group exactly three)
_DEC = rf"(?:{_INT}(?:\.[0-9]+)?|\.[0-9]+)"
_DECIMAL_RE = re.compile(rf"^[+-]?{_DEC}$")
_SCI_E_RE = re.compile(rf"^[+-]?({_DEC})[eE]([+-]?[0-9]{{1,4}})$")
_SCI_TEN_RE = re.compile(
    rf"^[+-]?(?:({_DEC})(?:\\times|\\cdot|\*|x))?10\^(?:\{{([+-]?[0-9]{{1,4}})\}}|([0-9]))$"
)
_FRAC_TEX_RE = re.compile(r"^([+-]?)\\frac\{([+-]?[0-9]+)\}\{([+-]?[0-9]+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([+-]?)\\frac([0-9])([0-9])$")  # \frac12
_FRAC_SLASH_RE = re.compile(r"^([+-]?[0-9]+)/([+-]?[0-9]+)$")
_MIXED_RE = re.compile(r"^([+-]?)([0-9]+)\\frac\{([0-9]+)\}\{([0-9]+)\}$")  # 2\frac{1}{4} = 9/4

_BOLD_RE = re.compile(r"^\\(?:textbf|mathbf|boldsymbol|bm)\s*\{(.*)\}$")
_MONEY_PREFIX_RE = re.compile(r"^\\?\$\s*")  # \$18
_PERCENT_RE = re.compile(r"\s*\\?%$")
_DEGREE_RE = re.compile(r"\s*(?:\^\s*\{?\\circ\}?|°)$")
_UNIT_TEX_RE = re.compile(r"\s*\\(?:text|mathrm|mbox|textrm)\s*\{([A-Za-z .]*)\}(?:\^\{?[23]\}?)?$")
_UNIT_WORDS_RE = re.compile(r"\s+([A-Za-z]+(?:\s+[A-Za-z]+)?)$")
_HEDGE_WORDS = _words(
    "or and not but than more less least most at about approximately around between "
    "either neither nor except maybe plus minus times over under to is isnt none no"
)
_SPACED_OPS_RE = re.compile(r"\s*(\\times|\\cdot|\*|\^|/)\s*")
_BRACE_SPACE_RE = re.compile(r"\{\s*([^{}]*?)\s*\}")
_DFRAC_RE = re.compile(r"\\[dt]frac")


@dataclass(frozen=True)
class NumberLiteral:
    """A parsed number literal: its exact ``value``, whether it is ``plain`` (an integer or decimal,
    no fraction bar or exponent), and ``ints``: the integers that make it a restatement when the
    prompt gives every one of them (a fraction's or mixed number's integers, a power's mantissa, or
    ``10`` and the exponent of a bare power of ten; see :func:`restates_question`)."""

    value: Fraction
    plain: bool
    ints: tuple[int, ...]
    is_ratio: bool = False  # a fraction or mixed number (judged by its value, see restates_question)


_SEPARATOR_RE = re.compile(r"[,;&]|\\q?quad|\\text|\\\\|\band\b")


def _equation_rhs(s: str) -> str:
    """What follows the last ``=`` (``x = 3`` and ``22+48 = 70`` state 3 and 70); ``s`` itself when
    there is none or the relation is not equality (``!=``, ``<=``, ``\\not=``), so it stays unparsable."""
    i = s.rfind("=")
    if i < 0:
        return s
    left = s[:i].rstrip()
    if not left or left[-1] in "!<>:=" or left.endswith("\\not") or _SEPARATOR_RE.search(left):
        return s  # not one equality, or several statements (a = 2, b = 3): no single stated value
    return s[i + 1 :].strip()


def _strip_decorations(s: str) -> str:
    """Drop what may surround a number without changing it: ``$``, bold, an equation's left side
    (``x =``), a currency sign, a trailing unit (letters only, none of them a hedge like
    ``or``/``more``; ``\\text{cm}^2`` too), ``%`` and degrees."""
    s = s.strip().strip("$").strip()
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    m = _BOLD_RE.match(s)
    s = m.group(1).strip() if m else s
    s = _equation_rhs(s)
    s = _MONEY_PREFIX_RE.sub("", s, count=1)
    for _ in range(2):  # a unit and a percent/degree sign, in either order
        m = _UNIT_TEX_RE.search(s) or _UNIT_WORDS_RE.search(s)
        if m and not (set(m.group(1).lower().split()) & _HEDGE_WORDS):
            s = s[: m.start()].rstrip()
        s = _PERCENT_RE.sub("", s)
        s = _DEGREE_RE.sub("", s)
    s = s.replace("\\!", "").replace("{,}", ",").replace("\\,", ",")
    s = _SPACED_OPS_RE.sub(r"\1", s)
    return _BRACE_SPACE_RE.sub(r"{\1}", s).strip()


def _dec(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _ints_of(*parts: str) -> tuple[int, ...]:
    return tuple(int(p) for part in parts if part for p in re.findall(r"[0-9]+", part.replace(",", "")))


def _fraction(sign: str, num: str, den: str) -> NumberLiteral | None:
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return NumberLiteral(-value if sign == "-" else value, False, _ints_of(num, den), is_ratio=True)


def parse_number(text: str) -> NumberLiteral | None:
    """``text`` as a number literal, or None when it is anything else.

    A number literal is, after :func:`_strip_decorations`, one of: an integer or decimal with an
    optional sign (``-3``, ``12.0``, ``.5``, ``1,000`` with commas grouping exactly three digits);
    a fraction of two integers (``1/2``, ``\\frac{1}{2}``, ``\\dfrac12``, ``-\\frac{3}{4}``) or a mixed
    number (``2\\frac{1}{4}``);
    scientific notation with base ten and an integer exponent (``7e1``, ``1.5E-3``,
    ``7\\times 10^{1}``, ``10^{3}``). Whitespace between digits (``3 4``), any other operator, any
    letter left over and any non-ASCII digit make it not a number.
    """
    s = _strip_decorations(unicodedata.normalize("NFC", text))
    if not s or re.search(r"\s", s) or not s.isascii():
        return None
    s = _DFRAC_RE.sub(r"\\frac", s)
    if _DECIMAL_RE.match(s):
        return NumberLiteral(_dec(s), True, _ints_of(s))
    m = _SCI_E_RE.match(s)
    if m:
        value = _dec(m.group(1)) * Fraction(10) ** int(m.group(2))
        return NumberLiteral(-value if s.startswith("-") else value, False, _ints_of(m.group(1)))
    m = _SCI_TEN_RE.match(s)
    if m:
        mantissa, exponent = m.group(1), m.group(2) or m.group(3)
        value = (_dec(mantissa) if mantissa else Fraction(1)) * Fraction(10) ** int(exponent)
        return NumberLiteral(
            -value if s.startswith("-") else value,
            False,
            _ints_of(mantissa) if mantissa else (10, int(exponent)),
        )
    for pattern in (_FRAC_TEX_RE, _FRAC_SHORT_RE):
        m = pattern.match(s)
        if m:
            return _fraction(*m.groups())
    m = _FRAC_SLASH_RE.match(s)
    if m:
        return _fraction("", m.group(1), m.group(2))
    m = _MIXED_RE.match(s)
    if m and int(m.group(4)) != 0:
        whole = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        return NumberLiteral(
            -whole if m.group(1) == "-" else whole, False, _ints_of(*m.groups()[1:]), is_ratio=True
        )
    return None


def prompt_numbers(prompt: str) -> set[int]:
    """The integers written in ``prompt`` (after NFKC, so full-width and other digits count too)."""
    text = unicodedata.normalize("NFKC", prompt)
    return {int(d) for d in re.findall(r"\d+", text)}


def restates_question(answer: NumberLiteral, answer_text: str, gold_text: str, prompt: str) -> bool:
    """Whether a fraction, mixed number or power-of-ten answer only rewrites numbers the prompt gave.

    ``140/2`` for "What is 140 divided by 2?" evaluates to the gold without anyone having divided,
    and so does ``\\frac{280}{4}`` (both numbers scaled: no division done either), so a fraction
    or mixed number restates when its value is the ratio of two numbers of the prompt. A power of
    ten restates when the prompt gives its mantissa (``7\\times 10^{1}`` or ``7e1`` for "What is 7
    times 10?"; the exponent only counts zeros), or 10 and the exponent of a bare ``10^{k}``. A
    plain integer or decimal cannot restate anything, and the gold written exactly as the gold is
    written (``3/8`` for gold ``3/8``) is the requested form, so neither is refused.
    """
    if answer.plain or not answer.ints:
        return False
    if _canonical(answer_text) == _canonical(gold_text):
        return False
    given = prompt_numbers(prompt)
    if answer.is_ratio:
        target = abs(answer.value)
        return any(b and Fraction(a, b) == target for a in given for b in given)
    return all(n in given for n in answer.ints)


def _canonical(text: str) -> str:
    """A spelling-insensitive form for "the same as written": no spaces, ``\\dfrac`` -> ``\\frac``,
    ``\\frac{a}{b}`` -> ``a/b``."""
    s = _strip_decorations(text)
    s = _DFRAC_RE.sub(r"\\frac", re.sub(r"\s+", "", s))
    s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"\1/\2", s)
    return re.sub(r"\\frac([0-9])([0-9])", r"\1/\2", s)


# ---------------------------------------------------------------------------------------- text

_TEXT_WRAP_RE = re.compile(
    r"^\\(?:text|textbf|textit|mathrm|mbox|textrm|operatorname)\s*\{(.*)\}$", re.DOTALL
)
_MATH_WORDS = _words(
    "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln "
    "exp lim sqrt pi inf infty infinity det max min gcd lcm mod deg"
)
_MATH_CHARS = set("0123456789=+-*/^_{}()[]<>|\\")


def _unwrap_text(s: str) -> str:
    s = s.strip().strip("$").strip()
    while True:
        m = _TEXT_WRAP_RE.match(s)
        if not m:
            return s
        s = m.group(1).strip()


def normalize_text(s: str) -> str:
    """The form two word answers are compared in: NFKC, one ``\\text{}``-like wrapper and ``$``
    removed, case-folded, runs of whitespace made one space, surrounding quotes and a final
    period dropped."""
    s = unicodedata.normalize("NFKC", s).strip()
    s = _unwrap_text(s[:-1] if s.endswith(".") else s)
    s = re.sub(r"\s+", " ", s).strip().casefold()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'`":
        s = s[1:-1].strip()
    return s[:-1].rstrip() if s.endswith(".") else s


def classify_gold(gold: str) -> str:
    """``number``, ``text`` or ``math`` (module docstring).

    A gold is **text** when, once a ``\\text{}`` wrapper is removed, it holds no digit, no LaTeX
    command and no math symbol, and has a word of two or more letters that is not a math name
    (``sin``, ``pi``, ``infty``...): ``listen``, ``no solution``, ``Alice and Bob``. A lone letter
    (``x``, ``A``) stays math, as math-verify compares symbols exactly.
    """
    if parse_number(gold) is not None:
        return "number"
    inner = _unwrap_text(gold)
    if inner and not (set(inner) & _MATH_CHARS):
        words = re.findall(r"[^\W\d_]+", inner)
        if any(len(w) >= 2 and w.lower() not in _MATH_WORDS for w in words):
            return "text"
    return "math"


def _prompt_canonical(s: str) -> str:
    s = unicodedata.normalize("NFKC", s)
    s = re.sub(r"\\left|\\right|\$|\s+", "", s)
    return _DFRAC_RE.sub(r"\\frac", s)


def echoes_prompt(answer_text: str, gold_text: str, prompt: str) -> bool:
    """Whether a math answer is a piece of the prompt copied back (spaces, ``$``, ``\\left`` and
    ``\\right`` aside) that holds an operation and is not the gold as written."""
    a = _prompt_canonical(answer_text)
    if len(a) < 3 or not re.search(r"[-+*/^=]|\\[a-zA-Z]+", a):
        return False
    stripped = a[1:-1] if a[0] in "([{" and a[-1] in ")]}" else a
    if a == _prompt_canonical(gold_text) or stripped == _prompt_canonical(gold_text):
        return False
    p = _prompt_canonical(prompt)
    return a in p or (len(stripped) >= 3 and stripped in p)


_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
MAX_SPANS, MAX_SPAN_CHARS = 16, 400


def math_spans(prompt: str) -> list[str]:
    """The prompt's math spans (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``), at most
    :data:`MAX_SPANS` of at most :data:`MAX_SPAN_CHARS` characters: what a math answer must not
    merely restate, compared by the verifier after parsing (so ``(1+x)^2`` restates ``$(x+1)^2$``)."""
    spans = []
    for m in _SPAN_RE.finditer(prompt):
        text = next(g for g in m.groups() if g is not None).strip()
        if text and len(text) <= MAX_SPAN_CHARS:
            spans.append(text)
    return spans[:MAX_SPANS]
