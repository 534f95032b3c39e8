"""AnyText: any string within its lengths, and the sampling behaviour of a gymnasium Text space
over printable ASCII (its charset fields are derived once and shared)."""

from __future__ import annotations

import pytest
from gymnasium import spaces

from fr_agents.spaces import _SAMPLE_CHARSET, AnyText


def test_any_text_samples_and_indexes_like_a_text_space_over_printable_ascii() -> None:
    ours, ref = (
        AnyText(64, min_length=2, seed=3),
        spaces.Text(64, min_length=2, charset=_SAMPLE_CHARSET, seed=3),
    )
    assert ours.character_set == ref.character_set and ours.characters == ref.characters
    assert [ours.character_index(c) for c in "a Z~"] == [ref.character_index(c) for c in "a Z~"]
    assert (ours.min_length, ours.max_length) == (2, 64)
    drawn = [ours.sample() for _ in range(20)]
    assert all(2 <= len(x) <= 64 and set(x) <= set(_SAMPLE_CHARSET) for x in drawn)
    assert AnyText(64, min_length=2, seed=3).sample() == drawn[0]  # the seed is this space's own


def test_any_text_contains_any_string_within_its_lengths() -> None:
    s = AnyText(5, min_length=1)
    assert s.contains("é\n\t€") and s.contains("abcde")
    assert not s.contains("") and not s.contains("abcdef") and not s.contains(3)


def test_spaces_do_not_share_a_random_generator() -> None:
    a, b = AnyText(8), AnyText(8)
    a.seed(1)
    b.seed(2)
    assert a.np_random is not b.np_random


@pytest.mark.parametrize("bad", [{"max_length": 3, "min_length": 4}, {"max_length": 3, "min_length": -1}])
def test_bad_lengths_are_refused_as_text_refuses_them(bad: dict) -> None:
    with pytest.raises(ValueError):
        AnyText(**bad)
