"""The full deterministic generated set: paper-sized eval splits, checked by its content hash.

Generate it (about half an hour on one core), then point the test at it::

    fr-agents alfworld generate --out /data/alfw --n 20 --seed 0 --workers 1
    FR_AGENTS_ALFWORLD_FULLSET=/data/alfw pytest -m slow tests/envs/alfworld/test_full_set.py

The hash below was recorded from that command (docs/alfworld.md). A different hash means the
generator (or the shipped alfworld data) no longer writes the same games from seed 0.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from envs.alfworld.generate import build_game, content_hash

pytestmark = [pytest.mark.alfworld, pytest.mark.slow]

FULLSET_ENV = "FR_AGENTS_ALFWORLD_FULLSET"
FULLSET_HASH = "f9cba29f556134af14bb650388f32fe0cedcda0ea475406f3a9ce035d37028bb"
FULLSET_COUNTS = {"train": 20, "valid_seen": 140, "valid_unseen": 134}


@pytest.fixture(scope="module")
def fullset() -> Path:
    root = os.environ.get(FULLSET_ENV)
    if not root:
        pytest.skip(
            f"{FULLSET_ENV} is not set (point it at `fr-agents alfworld generate --out DIR --n 20 --seed 0`)"
        )
    path = Path(root)
    if not (path / "manifest.json").is_file():
        pytest.skip(f"{FULLSET_ENV}={root} holds no manifest.json (generation not run or not finished)")
    return path


def test_manifest_counts_match_the_paper_eval_sizes(fullset: Path) -> None:
    manifest = json.loads((fullset / "manifest.json").read_text())
    assert manifest["seed"] == 0
    per_split = Counter(g["split"] for g in manifest["games"])
    assert per_split["valid_seen"] >= 140
    assert per_split["valid_unseen"] >= 134
    assert per_split["train"] > 0
    assert dict(per_split) == FULLSET_COUNTS
    # Every listed game is on disk.
    assert all((fullset / g["path"] / "game.tw-pddl").is_file() for g in manifest["games"])


def test_content_hash_recomputed_from_the_files(fullset: Path) -> None:
    manifest = json.loads((fullset / "manifest.json").read_text())
    assert manifest["content_hash"] == FULLSET_HASH
    # Over the set's own games: a folder reused for a run with a larger --n may hold extra games,
    # which are not part of this set (in a fresh folder both are the same).
    assert content_hash(fullset, [g["path"] for g in manifest["games"]]) == FULLSET_HASH


@pytest.mark.parametrize(("split", "index"), [("train", 7), ("valid_seen", 139), ("valid_unseen", 0)])
def test_games_regenerate_identically(fullset: Path, split: str, index: int) -> None:
    """Determinism spot check: game ``index`` of ``split`` rebuilt from seed 0 equals the stored one."""
    manifest = json.loads((fullset / "manifest.json").read_text())
    (rel,) = [g["path"] for g in manifest["games"] if g["split"] == split and g["index"] == index]
    game, traj, _ = build_game(0, split, index)
    assert game == json.loads((fullset / rel / "game.tw-pddl").read_text())
    assert traj == json.loads((fullset / rel / "traj_data.json").read_text())
