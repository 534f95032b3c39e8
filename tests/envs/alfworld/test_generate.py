"""Offline game generation: task types, ALFRED's scene/placement rules, determinism, solvability."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envs.alfworld.generate import content_hash, find_games, generate
from envs.alfworld.sampling import TASK_TYPES
from envs.alfworld.scenes import LAMP_HOLDERS, constants, split_scenes

pytestmark = pytest.mark.alfworld


def _load(game_path: str) -> tuple[dict, dict]:
    game = json.loads(Path(game_path).read_text())
    traj = json.loads((Path(game_path).parent / "traj_data.json").read_text())
    return game, traj


def test_every_task_type_in_each_split(games_root: str) -> None:
    for split in ("valid_seen", "valid_unseen"):
        games = find_games(games_root, split)
        assert len(games) == 6
        assert sorted(_load(g)[1]["task_type"] for g in games) == sorted(TASK_TYPES)


def test_unseen_uses_held_out_scenes(games_root: str) -> None:
    c = constants()
    for g in find_games(games_root, "valid_unseen"):
        assert _load(g)[1]["scene"]["scene_num"] in c.TEST_SCENE_NUMBERS
    for g in find_games(games_root, "valid_seen"):
        assert _load(g)[1]["scene"]["scene_num"] in c.TRAIN_SCENE_NUMBERS
    assert not set(split_scenes("valid_unseen")) & set(split_scenes("valid_seen"))


def test_scene_kinds_follow_goals_valid(games_root: str) -> None:
    for g in find_games(games_root):
        traj = _load(g)[1]
        kind = traj["scene"]["scene_kind"]
        assert kind in constants().GOALS_VALID[traj["task_type"]]
        if traj["task_type"] in ("pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep"):
            assert kind == "Kitchen"
        if traj["task_type"] == "look_at_obj_in_light":
            assert kind in ("Bedroom", "LivingRoom")


def _facts(problem: str, pred: str) -> list[list[str]]:
    return [m.split() for m in re.findall(rf"\({pred} ([^()]*)\)", problem)]


def test_placements_respect_receptacle_rules(games_root: str) -> None:
    c = constants()
    for g in find_games(games_root):
        game, traj = _load(g)
        problem = game["pddl_problem"].split("(:goal")[0]  # the initial state only
        otype = {o: t.removesuffix("Type") for o, t in _facts(problem, "objectType")}
        rtype = {r: t.removesuffix("Type") for r, t in _facts(problem, "receptacleType")}
        for o, r in _facts(problem, "inReceptacle"):
            if otype[o] in ("DeskLamp", "FloorLamp"):  # lamps: explicitly on a desk/side table/dresser
                assert rtype[r] in LAMP_HOLDERS
            else:
                assert otype[o] in c.VAL_RECEPTACLE_OBJECTS[rtype[r]], (otype[o], rtype[r])
        params = traj["pddl_params"]
        if params["parent_target"]:  # the goal is not satisfied at the start
            for o, r in _facts(problem, "inReceptacle"):
                if otype[o] == params["object_target"]:
                    assert rtype[r] != params["parent_target"]


def test_every_game_is_solved_and_has_a_walkthrough(games_root: str) -> None:
    for g in find_games(games_root):
        game, traj = _load(g)
        assert game["solvable"] is True and game["walkthrough"]
        assert "UNKNOWN GOAL" not in game["grammar"]
        assert traj["turk_annotations"]["anns"][0]["task_desc"] in game["grammar"]


def test_generation_is_deterministic(tmp_path: Path, games_root: str) -> None:
    generate(tmp_path / "a", {"valid_seen": 2}, seed=11, workers=1)
    generate(tmp_path / "b", {"valid_seen": 2}, seed=11, workers=1)
    generate(tmp_path / "c", {"valid_seen": 2}, seed=12, workers=1)
    ha, hb, hc = (content_hash(tmp_path / x) for x in "abc")
    assert ha == hb != hc
    # The same games as the first two of the session set (built with 2 workers): order-independent.
    seen = sorted(str(Path(p).parent.relative_to(games_root)) for p in find_games(games_root, "valid_seen"))
    first_two = [f for f in seen if f.endswith(("_00000", "_00001"))]
    assert content_hash(tmp_path / "a") == content_hash(games_root, first_two)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["content_hash"] == ha


def test_bad_counts_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown split"):
        generate(tmp_path, {"test": 1})
    with pytest.raises(ValueError, match="counts"):
        generate(tmp_path, {"train": -1})


def test_cli_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fr_agents.cli import main

    out = tmp_path / "games"
    rc = main(
        [
            "alfworld",
            "generate",
            "--out",
            str(out),
            "--n",
            "1",
            "--seen",
            "1",
            "--unseen",
            "0",
            "--seed",
            "3",
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["games"] == {"train": 1, "valid_seen": 1}
    assert report["content_hash"] == content_hash(out)
    assert len(find_games(out, "train")) == 1
