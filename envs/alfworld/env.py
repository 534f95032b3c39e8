"""``fr_agents/ALFWorld-v0``: household tasks in ALFWorld's own TextWorld engine.

One episode::

    env = gymnasium.make("fr_agents/ALFWorld-v0", split="valid_unseen")
    obs, info = env.reset(seed=0)       # room description + "Your task is to: ..." (+ admissible commands)
    obs, reward, terminated, truncated, info = env.step("<action>go to fridge 1</action>")

* Actions: the text inside the last ``<action>...</action>``, else the last non-empty line.
* An inadmissible command goes to the engine, which answers "Nothing happens."; a hint follows.
* Winning gives reward 1.0 and ends the episode (``terminated``); after ``max_turns`` (default 50) the
  episode is ``truncated``. ``info["partial_score"]`` is the fraction of goal conditions satisfied
  (:mod:`envs.alfworld.progress`), ``info["won"]`` the engine's goal check.
* ``list_admissible=True`` appends the admissible commands to every observation (as the paper's
  agents see them).
* ``env.unwrapped.fork()`` replays the episode's commands in a fresh engine (games are deterministic).
* ``env.unwrapped.expert_action()`` is the next command of the expert: the stored walkthrough while the
  episode follows it, else a fresh Fast Downward plan from the current state; ``expert_reply()`` wraps it
  in ``<action>...</action>`` (``--agent expert`` in play, rollout and eval plays these replies).

Games come from :mod:`envs.alfworld.sources` (official data via ``ALFWORLD_DATA``, a ``games_dir``,
or a small generated set). ``reset(options={"game": path_or_index})`` picks a game, as does
``reset(options={"task": task})`` with a task of the ``alfworld`` task source (its ``metadata.game``).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, SupportsFloat

from envs.alfworld.engine import ENGINE_POOL, make_textworld_env, plan
from envs.alfworld.expert import after_search, search_step
from envs.alfworld.progress import FactIndex, partial_score
from envs.alfworld.sources import resolve_games
from envs.base import TextEnv

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
INVALID_HINT = (
    "(That is not an admissible command here. Reply with exactly one command from the admissible "
    "list, e.g. 'look', 'inventory' or 'go to <receptacle>'.)"
)
INVALID_HINT_UNLISTED = (
    "(That is not a valid command here.)"  # list_admissible=False: there is no list to point at
)
FORMAT_HINT = "Reply with one command inside <action>...</action>."


def parse_action(text: str) -> str:
    """The command in a reply: the last ``<action>..</action>`` body, else the last non-empty line.

    Whitespace is collapsed and case folded (the engine's commands are lower case).
    """
    found = _ACTION_RE.findall(text)
    if found:
        cmd = found[-1]
    else:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        cmd = lines[-1] if lines else ""
    return " ".join(cmd.split()).lower().rstrip(".")


class ALFWorldEnv(TextEnv):
    """An ALFWorld text game.

    Args:
        split: ``train``, ``valid_seen`` or ``valid_unseen``.
        games_dir: a folder of games (generated or official); default: see :mod:`envs.alfworld.sources`.
        game_files: explicit ``game.tw-pddl`` paths (overrides ``games_dir``/``split``).
        task_types: restrict to some of the six task types.
        max_turns: steps before truncation.
        list_admissible: list the admissible commands in each observation.
        expert: what :meth:`expert_action` plays: ``planner`` (the walkthrough, else a plan from the
            current state) or ``search`` (:func:`envs.alfworld.expert.search_step` until the task's
            object is in view, then :func:`~envs.alfworld.expert.after_search`, a plan only past it).
        engine_workers: 0 plays the game in this process (every env of the process takes turns at
            one lock); N > 0 in the process's N engine worker processes
            (:class:`envs.alfworld.engine.EngineWorkers`), beside the policy and each other.
        render_mode: ``"ansi"`` returns the transcript from ``render()``.
    """

    metadata = {
        "render_modes": ["ansi"],
        "render_fps": 1,
    }  # one transcript per turn; gymnasium's checker asks for a rate

    def __init__(
        self,
        split: str = "valid_seen",
        games_dir: str | None = None,
        game_files: list[str] | None = None,
        task_types: list[str] | None = None,
        max_turns: int = 50,
        list_admissible: bool = True,
        expert: str = "planner",
        engine_workers: int = 0,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.check_render_mode(render_mode, "render_mode must be None or 'ansi', got {!r}")
        if engine_workers < 0:
            raise ValueError(f"engine_workers must be >= 0, got {engine_workers}")
        if expert not in ("planner", "search"):
            raise ValueError(f"expert must be 'planner' or 'search', got {expert!r}")
        if split not in ("train", "valid_seen", "valid_unseen"):
            raise ValueError(f"split must be train, valid_seen or valid_unseen, got {split!r}")
        if games_dir is not None and not Path(games_dir).is_dir():
            raise FileNotFoundError(f"games_dir: no such folder {games_dir}")
        self.split = split
        self._source = (games_dir, list(game_files) if game_files else None, task_types)
        self._games: list[str] | None = None
        self.max_turns = max_turns
        self.list_admissible = list_admissible
        self.expert = expert
        self.engine_workers = engine_workers
        self._plan: list[str] = []  # the expert's last plan, made after self._plan_at actions
        self._plan_at = 0
        self.init_text(render_mode)
        self._tw: Any = None
        self._loaded: str | None = None
        self._state: Any = None
        self._initial_facts: FactIndex = FactIndex(())
        self._game_file: str | None = None
        self._traj: dict = {}
        self._walkthrough: list[str] = []
        self._actions: list[str] = []
        self._turn = 0

    @property
    def games(self) -> list[str]:
        """The game files of this env (found, or generated, on first use)."""
        if self._games is None:
            games_dir, game_files, task_types = self._source
            self._games = resolve_games(self.split, games_dir, game_files, task_types)
        return self._games

    # ------------------------------------------------------------------ episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        game = options.get("game")
        if game is None and isinstance(options.get("task"), dict):  # a task-source Task (training)
            game = options["task"].get("metadata", {}).get("game")
            if game is None:
                raise ValueError(
                    "options['task']: an ALFWorld task needs metadata.game (a game.tw-pddl path)"
                )
        if game is None:
            game = self.games[int(self.np_random.integers(len(self.games)))]
        elif isinstance(game, int):
            if not 0 <= game < len(self.games):
                raise ValueError(f"options['game']: index {game} out of range 0..{len(self.games) - 1}")
            game = self.games[game]
        elif not Path(str(game)).exists():
            raise FileNotFoundError(f"options['game']: no such file {game}")
        self._load(str(game))
        obs = self._observation(self._state["feedback"].strip(), first=True)
        self._transcript = [("game", obs)]
        return obs, self._info(invalid=False)

    def _load(self, game_file: str) -> None:
        self._game_file = game_file
        data = json.loads(Path(game_file).read_text())
        self._walkthrough = list(data.get("walkthrough") or [])
        self._traj = json.loads((Path(game_file).parent / "traj_data.json").read_text())
        if self._loaded != game_file:  # load() translates the PDDL; a replay of the same game skips it
            self._release_engine()
            self._tw = ENGINE_POOL.take(
                game_file, self.engine_workers
            )  # an ended episode left it holding this game
            if self._tw is None:
                self._tw = make_textworld_env(workers=self.engine_workers)
                self._tw.load(game_file)
            self._loaded = game_file
        self._state = self._tw.reset()
        self._initial_facts = FactIndex(self._state["_facts"])  # what held before the agent acted
        self._actions, self._turn, self._done = [], 0, False
        self._plan, self._plan_at = [], 0

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action: expected a str, got {type(action).__name__}")
        self.ensure_running()
        cmd = parse_action(action)
        invalid = cmd not in self._state["admissible_commands"]
        self._state, _, _ = self._tw.step(cmd)
        self._actions.append(cmd)
        self._turn += 1
        won = bool(self._state["won"])
        feedback = self._state["feedback"].strip()
        if invalid:
            feedback = f"{feedback} {INVALID_HINT if self.list_admissible else INVALID_HINT_UNLISTED}"
        terminated = won
        truncated = not won and self._turn >= self.max_turns
        self._done = terminated or truncated
        obs = self._observation(feedback, first=False)
        self._transcript += [("agent", cmd), ("game", obs)]
        return obs, 1.0 if won else 0.0, terminated, truncated, self._info(invalid)

    def _observation(self, text: str, first: bool) -> str:
        parts = [text]
        if self.list_admissible and not self._state["won"]:
            cmds = "\n".join(f"- {c}" for c in self._state["admissible_commands"])
            parts.append(f"Admissible commands:\n{cmds}")
        if first:
            parts.append(FORMAT_HINT)
        return "\n\n".join(parts)

    def _info(self, invalid: bool) -> dict[str, Any]:
        won = bool(self._state["won"])
        score = partial_score(
            self._traj["task_type"],
            self._traj["pddl_params"],
            self._state["_facts"],
            won,
            self._initial_facts,
        )
        return {
            "won": won,
            "partial_score": score,
            "invalid_action": invalid,
            "turn": self._turn,
            "admissible_commands": list(self._state["admissible_commands"]),
            "task_type": self._traj["task_type"],
            "task": self.task_description,
            "game_file": self._game_file,
        }

    # ------------------------------------------------------------------ helpers

    @property
    def task_description(self) -> str:
        text = self._state["feedback"] if not self._actions else ""
        m = re.search(r"Your task is to: (.*)", text) if text else None
        if m:
            return m.group(1).strip()
        return self._traj.get("turk_annotations", {}).get("anns", [{}])[0].get("task_desc", "")

    @property
    def actions(self) -> list[str]:
        """The commands played so far this episode."""
        return list(self._actions)

    @property
    def walkthrough(self) -> list[str]:
        """The game's stored planner walkthrough (a winning command sequence from the start)."""
        return list(self._walkthrough)

    def expert_action(self) -> str:
        """The expert's next command (see ``expert`` in the class docstring): with ``planner`` the
        walkthrough while on it, else a plan from here; with ``search`` a search for the task's
        object until it is in view, then a plan. A plan is followed while the episode stays on it."""
        if self._done:
            raise RuntimeError("expert_action() on a finished episode")
        n = len(self._actions)
        if self.expert == "search":
            step = search_step(self._traj, self._transcript[0][1], self._transcript, self._actions)
            if step is not None:
                return step
            if not self._plan:  # the object is in view: the walkthrough from there, no planning
                target = self._traj["pddl_params"]["object_target"].lower()
                rest = after_search(target, self._walkthrough, self._transcript[-1][1], self._actions)
                if rest:
                    self._plan, self._plan_at = rest, n
        elif self._walkthrough[:n] == self._actions and n < len(self._walkthrough):
            return self._walkthrough[n]
        k = n - self._plan_at
        if not (self._plan and 0 <= k < len(self._plan) and self._actions[self._plan_at :] == self._plan[:k]):
            self._plan, self._plan_at, k = plan(self._tw), n, 0
        return self._plan[k] if k < len(self._plan) else "look"

    def expert_reply(self) -> str:
        """:meth:`expert_action` as a reply in the format the task asks for (what SFT demos teach)."""
        return f"<action>{self.expert_action()}</action>"

    def fork(self) -> ALFWorldEnv:
        """A fresh engine on the same game with this episode's commands replayed."""
        twin = object.__new__(ALFWorldEnv)
        twin.__dict__.update(self.__dict__)
        twin._tw, twin._loaded = None, None
        twin._transcript = list(self._transcript)
        twin._np_random = copy.deepcopy(self._np_random)
        if self._game_file is None:
            return twin
        twin._load(self._game_file)
        for cmd in self._actions:
            twin._state, _, _ = twin._tw.step(cmd)
        twin._actions = list(self._actions)
        twin._turn, twin._done = self._turn, self._done
        return twin

    def _release_engine(self) -> None:
        """Hand the engine to :data:`ENGINE_POOL` for a later episode of its game (closed if it
        holds none)."""
        if self._tw is not None:
            if self._loaded is not None:
                ENGINE_POOL.give(self._loaded, self._tw)
            else:
                self._tw.close()
        self._tw, self._loaded = None, None

    def release(self) -> None:
        self._release_engine()
