"""``benchmarks/alfworld.py --credit``'s reading of one reply: its verb, or ``number-less`` for an object
command that drops the object's number (the engine refuses it: every object in ALFWorld carries one)."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("take pen 3 from drawer 3", "take"),
        ("take pen from dresser 1", "number-less"),
        ("move book to diningtable 1", "number-less"),
        ("move book 2 to diningtable 1", "move"),
        ("clean mug with sinkbasin 1", "number-less"),
        ("heat apple 1 with microwave 1", "heat"),
        ("open drawer 5", "open"),
        ("go to countertop 1", "go"),
        ("use desklamp 1", "use"),
        ("", ""),
    ],
)
def test_reply_kind_names_the_verb_or_a_number_less_object_command(reply: str, kind: str) -> None:
    bench = load_benchmark("alfworld", as_name="alfworld_benchmark")  # not "alfworld": the package's name
    assert bench.reply_kind(reply) == kind


def test_loading_the_benchmark_leaves_the_alfworld_package_importable() -> None:
    import alfworld

    load_benchmark("alfworld", as_name="alfworld_benchmark")
    import alfworld as again

    assert again is alfworld and again.__file__.endswith("__init__.py")
