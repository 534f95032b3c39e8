"""Where ALFWorld games come from, in order of preference.

1. ``game_files`` / ``games_dir`` passed to the env (or ``FR_AGENTS_ALFWORLD_GAMES``);
2. the official data: ``$ALFWORLD_DATA/json_2.1.1`` with its ``train``, ``valid_seen`` and
   ``valid_unseen`` folders (games prepared by ``alfworld-generate``);
3. a small offline-generated set cached under ``~/.cache/fr_agents/alfworld/default-<split>`` (one
   game of each task type, seed 0), written on first use of that split. ``fr-agents alfworld generate`` writes
   the full evaluation-sized set.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from envs.alfworld.generate import find_games, generate

log = logging.getLogger(__name__)

DEFAULT_CACHE = Path(os.environ.get("FR_AGENTS_CACHE", Path.home() / ".cache" / "fr_agents")) / "alfworld"
_DEFAULT_PER_SPLIT = 6  # one game of each task type
_WRITING = threading.Lock()  # concurrent first resets of a split write its default set once


def official_root() -> Path | None:
    data = os.environ.get("ALFWORLD_DATA")
    if not data:
        return None
    root = Path(data) / "json_2.1.1"
    return root if root.is_dir() else None


def default_generated_root(split: str) -> Path:
    """The small default generated set of ``split`` (written on first call)."""
    root = DEFAULT_CACHE / f"default-{split}"
    with _WRITING:
        if not (root / "manifest.json").exists():
            log.info(
                "writing a small default ALFWorld game set to %s (fr-agents alfworld generate for more)", root
            )
            generate(root, {split: _DEFAULT_PER_SPLIT}, seed=0, workers=1)
    return root


def resolve_games(
    split: str,
    games_dir: str | None = None,
    game_files: list[str] | None = None,
    task_types: list[str] | None = None,
) -> list[str]:
    """The game files for ``split`` from the first available source (raises if none has any)."""
    if game_files:
        missing = [g for g in game_files if not Path(g).exists()]
        if missing:
            raise FileNotFoundError(f"game_files: no such file {missing[0]}")
        return list(game_files)
    games_dir = games_dir or os.environ.get("FR_AGENTS_ALFWORLD_GAMES")
    if games_dir:
        if not Path(games_dir).is_dir():
            raise FileNotFoundError(f"games_dir: no such folder {games_dir}")
        root = Path(games_dir)
    else:
        root = official_root() or default_generated_root(split)
    games = find_games(root, split, task_types)
    if not games:
        raise FileNotFoundError(f"no solvable ALFWorld games for split {split!r} under {root}")
    return games
