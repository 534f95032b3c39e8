"""The one text space every env uses.

``gymnasium.spaces.Text`` defaults to an alphanumeric charset, so ``"say hi"`` is not a member
of it and gymnasium's env checker would reject every natural-language observation. ``AnyText``
accepts any ``str`` up to ``max_length`` characters (any characters at all) while staying a
``Text`` subclass, so tools that inspect spaces still see a text space.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium import spaces

# Printable ASCII used only when *sampling*; membership accepts any character.
_SAMPLE_CHARSET = "".join(chr(c) for c in range(32, 127))


@functools.cache
def _charset_fields() -> dict[str, Any]:
    """The charset fields ``Text`` derives from ``_SAMPLE_CHARSET`` (its ``_char*`` attributes),
    derived once: every env builds two spaces per episode, and deriving them costs ~80 us each."""
    full = spaces.Text(1, charset=_SAMPLE_CHARSET)
    return {k: v for k, v in vars(full).items() if k.startswith("_char")}


class AnyText(spaces.Text):
    """A text space containing every ``str`` with ``min_length <= len(s) <= max_length``."""

    def __init__(self, max_length: int = 65536, min_length: int = 0, seed: int | None = None) -> None:
        # Text's own checks of the lengths and the seed, on a one-character charset; then the
        # sampling charset's fields, derived once and shared (they are never modified).
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET[0], seed=seed)
        self.__dict__.update(_charset_fields())

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:  # noqa: ARG002
        length = int(self.np_random.integers(self.min_length, min(self.max_length, 64) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARSET), size=length)
        return "".join(_SAMPLE_CHARSET[i] for i in np.asarray(idx))

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and (other.min_length, other.max_length) == (
            self.min_length,
            self.max_length,
        )
