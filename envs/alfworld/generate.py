"""Offline ALFWorld games: ``game.tw-pddl`` + ``traj_data.json`` for the six task types.

The official ALFWorld games (json_2.1.1) come from ALFRED trajectories recorded in AI2-THOR. When
they cannot be had, this module writes games of the same format from what the ``alfworld`` wheel
ships: the floor-plan layouts (:mod:`envs.alfworld.scenes`), ALFRED's placement and scene rules
(:mod:`envs.alfworld.sampling`), the goal library and the PDDL domain/grammar. Every game is checked
once with the Fast Downward planner through ALFWorld's engine (on the task-relevant objects, as ALFRED
planned, see :func:`task_projection`): its plan is replayed in the full game and must reach ``won``;
that plan is stored as the game's ``walkthrough``.

Determinism: game ``i`` of split ``s`` with seed ``S`` draws everything from a ``random.Random`` seeded
by a hash of ``(S, s, i, attempt)``, so a set does not depend on worker count or order, and
:func:`content_hash` of the written folder is a stable fingerprint.

Layout (the one ``AlfredTWEnv.collect_game_files`` walks)::

    OUT/<split>/<task_type>-<Object>-None-<Parent|Lamp>-<scene>/trial_<seed>_<index>/{game.tw-pddl,traj_data.json}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from envs.alfworld.engine import data_files, make_textworld_env, plan
from envs.alfworld.pddl_problem import problem_pddl
from envs.alfworld.sampling import TASK_TYPES, SampleError, TaskSample, sample_task, scene_allows
from envs.alfworld.scenes import load_scene, split_scenes
from fr_agents.seeding import stable_seed

log = logging.getLogger(__name__)

SPLITS = ("train", "valid_seen", "valid_unseen")
# The paper's evaluation counts (ALFWorld: 140 seen, 134 unseen).
DEFAULT_COUNTS = {"train": 300, "valid_seen": 140, "valid_unseen": 134}
MAX_ATTEMPTS = 20


@dataclass
class GameRecord:
    """One written game."""

    split: str
    index: int
    path: str  # folder, relative to the output root
    task_type: str
    scene: int
    walkthrough_len: int
    attempts: int


def _rng(seed: int, split: str, index: int, attempt: int) -> random.Random:
    """The random stream of one attempt at one game (see the module docstring)."""
    return random.Random(
        stable_seed(
            "alfworld", seed, split, index, attempt, sep="|", bits=64, algorithm="sha256", byteorder="big"
        )
    )


def task_description(task_type: str, params: dict, rng: random.Random) -> str:
    """A templated goal from ``goal_library`` (as ``alfworld.agents.utils.misc.get_templated_task_desc``)."""
    import alfworld.gen.goal_library as glib

    template = rng.choice(glib.gdict[task_type]["templates"])
    return template.format(
        obj=params["object_target"].lower(),
        recep=params["parent_target"].lower(),
        toggle=params["toggle_target"].lower(),
        mrecep="",
    )


def task_projection(sample: TaskSample) -> TaskSample:
    """The same task with only the task-relevant objects (target type and lamp), as ALFRED planned.

    ALFRED's planning problems listed only the objects a task is about; Fast Downward's search time
    grows quickly with the number of movable objects (tens of seconds for a full kitchen), while a
    plan found without the distractors is also a plan with them (no action is blocked by an object
    it does not mention, and the Demangler numbers instances per type, so names are unchanged).
    """
    keep = {sample.object_target, sample.toggle_target} - {""}
    objects = {oid: v for oid, v in sample.objects.items() if v[0] in keep}
    return replace(sample, objects=objects)


def solve(game: dict, planning_game: dict | None = None) -> list[str] | None:
    """A winning walkthrough for ``game``, or None.

    The planner runs on ``planning_game`` (default: ``game``) through ALFWorld's engine; its plan is
    then replayed command by command in ``game`` and kept only if the engine reports ``won``.
    """
    env = make_textworld_env()
    if planning_game is not None:
        env.load(planning_game)
        env.reset()
        walkthrough = plan(env)
        env = make_textworld_env()
    env.load(game)
    env.reset()
    if planning_game is None:
        walkthrough = plan(env)
    if not walkthrough:
        return None
    won = False
    for cmd in walkthrough:
        state, _, done = env.step(cmd)
        won = bool(state["won"])
        if done:
            break
    return walkthrough if won else None


def build_game(seed: int, split: str, index: int) -> tuple[dict, dict, int]:
    """Sample, write and solve game ``index`` of ``split``: returns (gamedata, traj_data, attempts)."""
    scenes = split_scenes(split)
    task_type = TASK_TYPES[index % len(TASK_TYPES)]  # balanced over the six types
    domain, grammar = data_files()
    for attempt in range(MAX_ATTEMPTS):
        rng = _rng(seed, split, index, attempt)
        allowed = [n for n in scenes if scene_allows(task_type, load_scene(n))]
        if not allowed:
            raise SampleError(f"no {split} scene allows {task_type}")
        scene = load_scene(rng.choice(allowed))
        try:
            sample = sample_task(task_type, scene, rng)
        except SampleError as e:
            log.debug("resample %s/%d: %s", split, index, e)
            continue
        params = sample.pddl_params
        desc = task_description(task_type, params, rng)
        name = f"plan_{split}_{seed}_{index}"
        game = {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", desc),
            "pddl_problem": problem_pddl(sample, name),
            "solvable": None,
            "walkthrough": None,
        }
        planning_game = dict(game, pddl_problem=problem_pddl(task_projection(sample), name))
        walkthrough = solve(game, planning_game)
        if walkthrough is None:
            log.debug("unsolvable %s/%d attempt %d", split, index, attempt)
            continue
        game["solvable"], game["walkthrough"] = True, walkthrough
        traj = {
            "task_type": task_type,
            "task_id": f"gen_{seed}_{split}_{index}",
            "split": split,
            "pddl_params": params,
            "scene": {
                "floor_plan": f"FloorPlan{scene.num}",
                "scene_num": scene.num,
                "scene_kind": scene.kind,
            },
            "turk_annotations": {
                "anns": [{"task_desc": desc, "high_descs": [], "assignment_id": "generated"}]
            },
            "generator": {"seed": seed, "index": index, "attempt": attempt, "source": "fr_agents offline"},
        }
        return game, traj, attempt + 1
    raise SampleError(f"{split}/{index}: no solvable {task_type} game in {MAX_ATTEMPTS} attempts")


def _game_dir(seed: int, split: str, index: int, traj: dict) -> str:
    p = traj["pddl_params"]
    target = p["parent_target"] or p["toggle_target"]
    folder = f"{traj['task_type']}-{p['object_target']}-None-{target}-{traj['scene']['scene_num']}"
    return f"{split}/{folder}/trial_{seed}_{index:05d}"


def _cached(out: str, seed: int, split: str, index: int) -> GameRecord | None:
    """A game already written by an earlier run of the same (seed, split, index), if any."""
    for path in sorted(Path(out).glob(f"{split}/*/trial_{seed}_{index:05d}/game.tw-pddl")):
        try:
            game = json.loads(path.read_text())
            traj = json.loads((path.parent / "traj_data.json").read_text())
        except (OSError, ValueError):
            continue
        if game.get("solvable") and traj.get("generator", {}).get("seed") == seed:
            rel = str(path.parent.relative_to(out))
            attempts = traj["generator"]["attempt"] + 1
            return GameRecord(
                split,
                index,
                rel,
                traj["task_type"],
                traj["scene"]["scene_num"],
                len(game["walkthrough"]),
                attempts,
            )
    return None


def _write_one(args: tuple[str, int, str, int]) -> GameRecord:
    out, seed, split, index = args
    cached = _cached(out, seed, split, index)
    if cached is not None:
        return cached
    game, traj, attempts = build_game(seed, split, index)
    rel = _game_dir(seed, split, index, traj)
    folder = Path(out) / rel
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "game.tw-pddl").write_text(json.dumps(game, sort_keys=True))
    (folder / "traj_data.json").write_text(json.dumps(traj, sort_keys=True, indent=1))
    return GameRecord(
        split, index, rel, traj["task_type"], traj["scene"]["scene_num"], len(game["walkthrough"]), attempts
    )


def generate(
    out: str | Path,
    counts: dict[str, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    on_game: Callable[[GameRecord], None] | None = None,
) -> list[GameRecord]:
    """Write ``counts[split]`` games per split under ``out`` (games already there are reused).

    ``workers`` > 1 uses processes (games are independent; the result does not depend on it).
    ``on_game`` is called with each game's record as it is done (in the set's order: a progress
    bar). A ``manifest.json`` lists every game and the set's :func:`content_hash`.
    """
    counts = dict(DEFAULT_COUNTS if counts is None else counts)
    for split, n in counts.items():
        if split not in SPLITS:
            raise ValueError(f"counts: unknown split {split!r} (use {SPLITS})")
        if n < 0:
            raise ValueError(f"counts[{split!r}] must be >= 0, got {n}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(out), seed, split, i) for split, n in counts.items() for i in range(n)]
    workers = workers or min(len(jobs), os.cpu_count() or 1) or 1
    t0 = time.perf_counter()
    records = []
    with ProcessPoolExecutor(workers) if workers > 1 else contextlib.nullcontext() as pool:
        done = pool.map(_write_one, jobs) if pool is not None else map(_write_one, jobs)
        for record in done:
            records.append(record)
            if on_game is not None:
                on_game(record)
    manifest = {
        "seed": seed,
        "counts": counts,
        "games": [r.__dict__ for r in records],
        "content_hash": content_hash(out, [r.path for r in records]),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=1))
    log.info(
        "wrote %d games to %s in %.1fs (hash %s)",
        len(records),
        out,
        manifest["seconds"],
        manifest["content_hash"],
    )
    return records


def content_hash(root: str | Path, folders: Iterable[str] | None = None) -> str:
    """sha256 over every game folder's ``game.tw-pddl`` and ``traj_data.json`` (path-sorted)."""
    root = Path(root)
    if folders is None:
        folders = [str(p.parent.relative_to(root)) for p in root.rglob("game.tw-pddl")]
    h = hashlib.sha256()
    for rel in sorted(folders):
        for name in ("game.tw-pddl", "traj_data.json"):
            h.update(f"{rel}/{name}\n".encode())
            h.update((root / rel / name).read_bytes())
    return h.hexdigest()


def find_games(
    root: str | Path, split: str | None = None, task_types: Iterable[str] | None = None
) -> list[str]:
    """Solvable ``game.tw-pddl`` paths under ``root`` (optionally one split / some task types), sorted.

    Works on generated sets and on the official json_2.1.1 data (``train``, ``valid_seen``,
    ``valid_unseen`` folders), skipping movable-receptacle and sliced games as ALFWorld does.
    """
    root = Path(root)
    base = root / split if split and (root / split).is_dir() else root
    wanted = set(task_types) if task_types else set(TASK_TYPES)
    games = []
    for path in sorted(base.rglob("game.tw-pddl")):
        rel = str(path.parent)
        if "movable" in rel or "Sliced" in rel:
            continue
        traj_path = path.parent / "traj_data.json"
        if not traj_path.exists():
            continue
        if json.loads(traj_path.read_text())["task_type"] not in wanted:
            continue
        if not json.loads(path.read_text()).get("solvable"):
            continue
        games.append(str(path))
    return games
