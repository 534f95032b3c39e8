"""ALFWorld games as tasks (``tasks.source: alfworld``), for training on ``fr_agents/ALFWorld-v0``.

Each task is one game: ``id`` is the game's last two folders (machine independent), ``prompt`` the
goal ("put a clean apple in fridge"), ``answer`` the game's stored expert walkthrough (one command
a line; the env, not this answer, scores episodes) and ``metadata`` carries ``game`` (the
``game.tw-pddl`` path the env loads when reset with ``options={"task": task}``), ``task_type`` and
``split``.

Splits follow ALFWorld's own: ``train`` games are the training split; ``valid_seen`` (the training
scenes, other games) and ``valid_unseen`` (scenes never seen in training) are the held-out ones, and
``test`` is ``valid_unseen``. Games come from :func:`envs.alfworld.sources.resolve_games`: a
``games_dir`` (e.g. one written by ``fr-agents alfworld generate``), else the official data under
``$ALFWORLD_DATA``, else a small generated set (six games a split, one per task type) cached on
first use.

Order: each split lists its games round-robin over the task types (the first game of each type in
type order, then the second of each, ...), so any prefix of a split covers the types evenly; the
trainer's warm start takes the first ``warm_start.examples`` train games as its demos.

Parameters: ``games_dir`` (``~`` is expanded), ``task_types`` (a list of the six type names;
default all), ``limit`` (at most this many games a split, spread over the types; default all),
``require`` (``{split: count}``: the games each split must hold, checked when the source is built,
before any work; short of them, :class:`MissingGames` names the exact ``fr-agents alfworld
generate`` command that writes them).
"""

from __future__ import annotations

import json
from pathlib import Path

from envs.tasks.base import Task, TaskSource, make_task
from fr_agents.config import ConfigError

CLI_SPLIT_FLAGS = {"train": "--n", "valid_seen": "--seen", "valid_unseen": "--unseen"}


class MissingGames(ConfigError):
    """A run needs more ALFWorld games than its games folder holds (the message names the command)."""


def generate_command(games_dir: str, require: dict[str, int], seed: int = 0) -> str:
    """The ``fr-agents alfworld generate`` command that writes ``require``'s games into ``games_dir``."""
    counts = {"train": 0, "valid_seen": 0, "valid_unseen": 0, **require}
    flags = " ".join(f"{CLI_SPLIT_FLAGS[s]} {n}" for s, n in counts.items())
    return f"fr-agents alfworld generate --out {games_dir} {flags} --seed {seed}"


SPLITS = ("train", "valid_seen", "valid_unseen")


def game_id(path: str | Path) -> str:
    """A machine-independent id of a game: its last two folders (``<task folder>/trial_...``)."""
    parts = Path(path).parts
    return "/".join(parts[-3:-1]) if len(parts) >= 3 else str(path)


def task_type(path: str | Path) -> str | None:
    """The task type of a ``game.tw-pddl`` (from its ``traj_data.json``), None when it has none."""
    try:
        return str(json.loads((Path(path).parent / "traj_data.json").read_text())["task_type"])
    except (OSError, ValueError, KeyError):
        return None


def game_task(path: str | Path, split: str) -> Task:
    """The :class:`Task` of one ``game.tw-pddl`` (reads it and its ``traj_data.json``)."""
    path = Path(path)
    game = json.loads(path.read_text())
    traj = json.loads((path.parent / "traj_data.json").read_text())
    anns = traj.get("turk_annotations", {}).get("anns") or [{}]
    goal = anns[0].get("task_desc", "") or traj["task_type"]
    return make_task(
        game_id(path),
        goal,
        "\n".join(game.get("walkthrough") or []),
        game=str(path),
        task_type=traj["task_type"],
        split=split,
    )


class AlfworldSource(TaskSource):
    """ALFWorld games by split (see the module docstring)."""

    name = "alfworld"
    split_names = ("train", "test", *SPLITS[1:])

    def __init__(
        self,
        seed: int = 0,
        games_dir: str | None = None,
        task_types: list[str] | None = None,
        limit: int | None = None,
        require: dict[str, int] | None = None,
    ) -> None:
        super().__init__(seed)
        games_dir = str(Path(games_dir).expanduser()) if games_dir is not None else None
        if require:
            self._check_required(games_dir, dict(require))
        if games_dir is not None and not Path(games_dir).is_dir():
            raise ConfigError(f"tasks.params.games_dir: no such folder {games_dir}")
        if limit is not None and limit < 1:
            raise ConfigError(f"tasks.params.limit: must be >= 1, got {limit}")
        self.games_dir, self.task_types, self.limit = games_dir, task_types, limit
        if task_types is not None:
            from envs.alfworld.sampling import TASK_TYPES

            unknown = sorted(set(task_types) - set(TASK_TYPES))
            if unknown:
                raise ConfigError(
                    f"tasks.params.task_types: unknown {', '.join(unknown)}; "
                    f"choose from {', '.join(TASK_TYPES)}"
                )

    @staticmethod
    def _check_required(games_dir: str | None, require: dict[str, int]) -> None:
        """Raise :class:`MissingGames` unless ``games_dir`` holds ``require[split]`` games of each split."""
        from envs.alfworld.generate import find_games

        bad = sorted(set(require) - set(CLI_SPLIT_FLAGS))
        if bad:
            raise ConfigError(f"tasks.params.require: unknown split {bad[0]!r} (use {', '.join(SPLITS)})")
        if games_dir is None:
            raise ConfigError(
                "tasks.params.require needs tasks.params.games_dir (the folder the games are written to)"
            )
        have = {s: len(find_games(games_dir, s)) if (Path(games_dir) / s).is_dir() else 0 for s in require}
        short = {s: n for s, n in require.items() if have[s] < n}
        if short:
            seed = 0
            manifest = Path(games_dir) / "manifest.json"
            if manifest.exists():
                seed = int(json.loads(manifest.read_text()).get("seed", 0))
            what = ", ".join(f"{s}: {have[s]} of {n}" for s, n in short.items())
            raise MissingGames(
                f"tasks.params.games_dir {games_dir} lacks ALFWorld games "
                f"({what}); write them once (cached there, games already written "
                f"are kept) with:\n    {generate_command(games_dir, require, seed)}"
            )

    def _load_split(self, split: str) -> list[Task]:
        from envs.alfworld.sources import resolve_games

        alf_split = "valid_unseen" if split == "test" else split
        games = resolve_games(alf_split, self.games_dir, None, self.task_types)
        other = set(SPLITS) - {alf_split}
        if any(other & set(Path(g).parts) for g in games):  # a folder without this split lists them all
            raise ConfigError(
                f"tasks.params.games_dir: no {alf_split} games (the folder holds only other splits); "
                f"write them with fr-agents alfworld generate"
            )
        if self.limit is not None and len(games) > self.limit:
            # evenly spaced: the paths are sorted by task-type folder, so every type keeps its share
            step = len(games) / self.limit
            games = [games[int(i * step)] for i in range(self.limit)]
        return round_robin([game_task(g, alf_split) for g in games])


def round_robin(tasks: list[Task]) -> list[Task]:
    """``tasks`` reordered round-robin over their ``task_type`` (types sorted by name, each type's
    games in their given order)."""
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t["metadata"]["task_type"], []).append(t)
    queues = [by_type[k] for k in sorted(by_type)]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
