"""The small arithmetic curriculum the tiny presets train on.

A ~1M-parameter model cannot read instructions, so the default prompt is just the sum, ``"12+7="``,
and the gold answer is ``"19"``; pair it with ``MathVerifier-v0(answer_format="plain")`` so the
whole (short) reply is the answer. Larger models can use ``template`` to add words.

Parameters (all keyword, via ``tasks.params`` in a config):

* ``digits`` – operands have 1..``digits`` digits (``min_digits`` sets the lower bound);
* ``min_operand`` – a smallest operand above ``min_digits``' bound (e.g. 3163 with 4 digits and ``*``:
  every product has exactly 8 digits);
* ``ops`` – any of ``"+"``, ``"-"``, ``"*"``; subtraction keeps results non-negative unless
  ``allow_negative`` is true;
* ``size`` – how many distinct problems; ``None`` enumerates every operand pair (up to 200k);
* ``test_fraction`` / ``test_size`` – the held-out share (default 10%);
* ``order`` – ``"random"`` (seeded) or ``"curriculum"`` (train split sorted easy to hard:
  fewer digits first, then fewer carries);
* ``template`` – ``"{a}{op}{b}="`` by default; fields ``{a}``, ``{op}``, ``{b}``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from envs.tasks.base import Task, TaskSource, holdout, make_task
from fr_agents.config import ConfigError

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_MAX_ENUMERATE = 200_000


def _carries(a: int, b: int) -> int:
    """Number of carries when adding ``a + b`` digit by digit (a difficulty proxy)."""
    carries, carry = 0, 0
    while a or b:
        s = a % 10 + b % 10 + carry
        carry = int(s >= 10)
        carries += carry
        a, b = a // 10, b // 10
    return carries


class ArithmeticSource(TaskSource):
    """Integer arithmetic problems like ``"12+7="`` -> ``"19"``."""

    name = "arithmetic"

    def __init__(
        self,
        seed: int = 0,
        digits: int = 2,
        min_digits: int = 1,
        ops: list[str] | tuple[str, ...] | str = ("+",),
        size: int | None = None,
        test_fraction: float = 0.1,
        test_size: int | None = None,
        order: str = "random",
        template: str = "{a}{op}{b}=",
        allow_negative: bool = False,
        min_operand: int | None = None,
    ) -> None:
        super().__init__(seed)
        ops = [ops] if isinstance(ops, str) else list(ops)
        if not ops or any(o not in _OPS for o in ops):
            raise ConfigError(f"tasks.params.ops: expected a list of {', '.join(_OPS)}, got {ops!r}")
        if not 1 <= min_digits <= digits <= 9:
            raise ConfigError(
                f"tasks.params.digits: need 1 <= min_digits <= digits <= 9, got {min_digits}, {digits}"
            )
        if min_operand is not None:
            try:
                min_operand = int(min_operand)  # a dotted override arrives as text
            except (TypeError, ValueError) as e:
                raise ConfigError(
                    f"tasks.params.min_operand: expected an integer, got {min_operand!r}"
                ) from e
        if min_operand is not None and not 0 <= min_operand <= 10**digits - 1:
            raise ConfigError(
                f"tasks.params.min_operand: must lie in [0, {10**digits - 1}] "
                f"(digits={digits}), got {min_operand}"
            )
        if order not in ("random", "curriculum"):
            raise ConfigError(f"tasks.params.order: expected 'random' or 'curriculum', got {order!r}")
        try:
            template.format(a=1, op="+", b=2)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"tasks.params.template: must use only {{a}}, {{op}}, {{b}} ({e})") from e
        self.digits, self.min_digits, self.ops = digits, min_digits, ops
        self.size, self.test_fraction, self.test_size = size, test_fraction, test_size
        self.order, self.template, self.allow_negative = order, template, allow_negative
        self.min_operand = min_operand
        self._splits: tuple[list[Task], list[Task]] | None = None

    def _operand_range(self) -> tuple[int, int]:
        low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        if self.min_operand is not None:
            low = max(low, self.min_operand)
        return low, 10**self.digits - 1

    def _triples(self) -> list[tuple[int, str, int]]:
        low, high = self._operand_range()
        width = high - low + 1
        total = width * width * len(self.ops)
        if self.size is None:
            if total > _MAX_ENUMERATE:
                raise ConfigError(
                    f"tasks.params.size: {total} problems at "
                    f"digits={self.digits}; set size (at most {_MAX_ENUMERATE})"
                )
            pairs = itertools.product(range(low, high + 1), repeat=2)
            triples = list(dict.fromkeys(self._canon(a, op, b) for op in self.ops for a, b in pairs))
        else:
            if not 1 <= self.size <= min(total // 2, _MAX_ENUMERATE):
                raise ConfigError(
                    f"tasks.params.size: must lie in [1, {min(total // 2, _MAX_ENUMERATE)}], got {self.size}"
                )
            rng = np.random.default_rng(self.seed)
            seen: set[tuple[int, str, int]] = set()
            triples = []
            while len(triples) < self.size:
                op = self.ops[int(rng.integers(len(self.ops)))]
                t = self._canon(int(rng.integers(low, high + 1)), op, int(rng.integers(low, high + 1)))
                if t not in seen:
                    seen.add(t)
                    triples.append(t)
        return triples

    def _canon(self, a: int, op: str, b: int) -> tuple[int, str, int]:
        """Order subtraction operands so the result is non-negative (unless allowed)."""
        if op == "-" and not self.allow_negative and a < b:
            return b, op, a
        return a, op, b

    def _task(self, a: int, op: str, b: int) -> Task:
        difficulty = max(len(str(a)), len(str(b))) * 10 + (_carries(a, b) if op == "+" else 0)
        return make_task(
            id=f"arith-{a}{op}{b}",
            prompt=self.template.format(a=a, op=op, b=b),
            answer=str(_OPS[op](a, b)),
            a=a,
            op=op,
            b=b,
            difficulty=difficulty,
        )

    def _load_split(self, split: str) -> list[Task]:
        if self._splits is None:
            tasks = [self._task(a, op, b) for a, op, b in self._triples()]
            train, test = holdout(tasks, self.seed, self.test_fraction, self.test_size)
            if self.order == "curriculum":
                train.sort(key=lambda t: (t["metadata"]["difficulty"], t["id"]))
            else:
                order = np.random.default_rng(self.seed + 1).permutation(len(train))
                train = [train[i] for i in order]
            self._splits = (train, test)
        return self._splits[0] if split == "train" else self._splits[1]

    def describe(self) -> dict[str, Any]:
        out = {"digits": self.digits, "ops": self.ops, "order": self.order, "template": self.template}
        if self.min_operand is not None:
            out["min_operand"] = self.min_operand
        return out
