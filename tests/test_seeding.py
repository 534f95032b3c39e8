"""One stable-seed hash (issue #49): every caller draws through ``fr_agents.seeding.stable_seed``, and
every seed is the one it drew before the callers shared it (a changed seed changes results).

The expected numbers were computed with the callers' own code before they were merged (the
evaluator's ``\\x1f``-joined 31-bit blake2b, the schedule's and the seeded engine's ``/``-joined
63-bit blake2b, ALFWorld's ``|``-joined sha256 read big-endian); the old formulas are repeated here
too, so inputs beyond the pinned ones are checked against them as well.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest

from envs.alfworld.generate import _rng
from fr_agents.eval.runner import item_seed, sample_seed
from fr_agents.policy.seeded import _mix
from fr_agents.seeding import stable_seed
from trainer.batches import derive_seed

ROOT = Path(__file__).resolve().parent.parent


def _old_eval(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _old_63(*parts: object) -> int:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _old_alfworld(seed: int, split: str, index: int, attempt: int) -> int:
    digest = hashlib.sha256(f"alfworld|{seed}|{split}|{index}|{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def test_the_pinned_seeds_are_the_ones_drawn_before() -> None:
    assert sample_seed(0, "math-tiny", "t17", 0) == 1238495977
    assert item_seed(3, "humaneval", "HumanEval/5") == 1769927417
    assert stable_seed("req", 12345, 7) == 748124443  # the evaluator's per-request seeds
    assert derive_seed("episode", 0, 0) == 7729223697553811168
    assert derive_seed("tasks", 1, 2) == 2060988949385078480
    assert derive_seed("sample", 99, 3) == 3709623152963497141
    assert _mix(1550039684152772504, 1, 0) == 9073831344510171617
    assert _rng(0, "train", 0, 0).random() == 0.6244718810817054
    assert stable_seed(
        "alfworld", 0, "train", 0, 0, sep="|", bits=64, algorithm="sha256", byteorder="big"
    ) == (15421885887249995067)


@pytest.mark.parametrize(
    "parts", [(0,), ("episode", 7, 123), ("fr-eval", 1, "b", "t/1", 4), (2**62, -3, "x\x1fy")]
)
def test_every_caller_matches_its_old_formula(parts: tuple) -> None:
    assert stable_seed(*parts) == _old_eval(*parts)
    assert derive_seed(*parts) == _old_63(*parts)
    ints = tuple(p for p in parts if isinstance(p, int))
    assert _mix(*ints) == _old_63(*ints)


@pytest.mark.parametrize(
    "args", [(0, "train", 0, 0), (7, "valid_seen", 12, 3), (123, "valid_unseen", 99, 19)]
)
def test_alfworld_games_draw_the_streams_they_drew(args: tuple) -> None:
    import random

    assert _rng(*args).getstate() == random.Random(_old_alfworld(*args)).getstate()


def test_stable_seed_rejects_widths_and_digests_it_does_not_have() -> None:
    with pytest.raises(ValueError, match="bits"):
        stable_seed(1, bits=65)
    with pytest.raises(ValueError, match="algorithm"):
        stable_seed(1, algorithm="md5")  # type: ignore[arg-type]


def test_no_other_module_hashes_a_seed() -> None:
    """Only ``fr_agents/seeding.py`` turns a hash digest into an integer: ``int.from_bytes`` in any
    other module of fr_agents/, trainer/, envs/ that imports ``hashlib`` is a second seed hash.
    (Two content digests that are not seeds are let through: the store's prompt key and the
    pruning keys, signed 64-bit lookup keys compared with the tokens they stand for.)"""
    not_seeds = {ROOT / "fr_agents" / "tree" / "store.py"}  # the prompt key and the pruning keys
    bad = []
    for package in ("fr_agents", "trainer", "envs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "fr_agents" / "seeding.py" or path in not_seeds:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imports_hashlib = any(
                isinstance(n, ast.Import)
                and any(a.name == "hashlib" for a in n.names)
                or isinstance(n, ast.ImportFrom)
                and n.module == "hashlib"
                for n in ast.walk(tree)
            )
            if not imports_hashlib:
                continue
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "from_bytes"
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "a seed hashed outside fr_agents.seeding.stable_seed: " + ", ".join(bad)
