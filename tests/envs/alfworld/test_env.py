"""ALFWorld-v0: expert wins every task type, invalid actions, partial scores, truncation, fork."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import pytest

from envs.alfworld.env import INVALID_HINT, INVALID_HINT_UNLISTED, ALFWorldEnv, parse_action
from envs.alfworld.expert import ExpertAgent
from envs.alfworld.generate import find_games
from envs.alfworld.sampling import TASK_TYPES

pytestmark = pytest.mark.alfworld


def _task_type(game: str) -> str:
    return json.loads((Path(game).parent / "traj_data.json").read_text())["task_type"]


def _game_of(root: str, task_type: str, split: str = "valid_seen") -> str:
    return next(g for g in find_games(root, split) if _task_type(g) == task_type)


@pytest.mark.parametrize("split", ["valid_seen", "valid_unseen"])
def test_expert_wins_every_task_type(games_root: str, split: str) -> None:
    env = ALFWorldEnv(split=split, games_dir=games_root)
    agent = ExpertAgent()
    won_types = set()
    for i, game in enumerate(env.games):
        obs, info = env.reset(options={"game": i})
        assert "Your task is to:" in obs and info["partial_score"] == 0.0 and not info["won"]
        for _ in range(env.max_turns):
            obs, reward, terminated, truncated, info = env.step(agent.act(env))
            if terminated or truncated:
                break
        assert terminated and not truncated and reward == 1.0 and info["won"], game
        assert info["partial_score"] == 1.0
        won_types.add(info["task_type"])
    assert won_types == set(TASK_TYPES)


def test_expert_recovers_after_a_detour(games_root: str) -> None:
    env = ALFWorldEnv(games_dir=games_root, task_types=["pick_and_place_simple"])
    obs, info = env.reset(seed=0)
    detour = next(c for c in info["admissible_commands"] if c.startswith("go to") and c != env.walkthrough[0])
    env.step(detour)
    for _ in range(env.max_turns - 1):
        _, reward, terminated, truncated, info = env.step(ExpertAgent().act(env))
        if terminated or truncated:
            break
    assert info["won"] and reward == 1.0


def test_invalid_action_gets_nothing_happens_and_a_hint(games_root: str) -> None:
    env = ALFWorldEnv(games_dir=games_root)
    _, info0 = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step("<action>fly to the moon</action>")
    assert obs.startswith("Nothing happens.") and INVALID_HINT in obs
    assert info["invalid_action"] and reward == 0.0 and not terminated and not truncated
    assert info["admissible_commands"] == info0["admissible_commands"]  # the state did not change
    obs, _, _, _, info = env.step("")  # an empty reply is invalid too
    assert obs.startswith("Nothing happens.") and info["invalid_action"]
    obs, _, _, _, info = env.step("I will look around.\nlook")
    assert not info["invalid_action"] and not obs.startswith("Nothing happens.")


def test_without_the_list_the_hint_points_at_no_list(games_root: str) -> None:
    env = ALFWorldEnv(games_dir=games_root, list_admissible=False)
    env.reset(seed=1)
    obs, *_ = env.step("<action>fly to the moon</action>")
    assert obs == f"Nothing happens. {INVALID_HINT_UNLISTED}"
    env.close()


def test_parse_action() -> None:
    assert parse_action("think...\n<action>Go To  Fridge 1</action>") == "go to fridge 1"
    assert parse_action("<action>look</action> then <action>inventory</action>") == "inventory"
    assert parse_action("I should open it.\n\nopen fridge 1.\n") == "open fridge 1"
    assert parse_action("   ") == ""


def test_partial_score_never_decreases_along_pick_and_place_walkthrough(games_root: str) -> None:
    for split in ("valid_seen", "valid_unseen"):
        game = _game_of(games_root, "pick_and_place_simple", split)
        env = ALFWorldEnv(game_files=[game])
        _, info = env.reset(seed=0)
        scores = [info["partial_score"]]
        for cmd in env.walkthrough:
            _, _, terminated, _, info = env.step(cmd)
            scores.append(info["partial_score"])
        assert terminated and info["won"]
        assert scores[0] == 0.0 and scores[-1] == 1.0
        assert all(b >= a for a, b in zip(scores, scores[1:], strict=False)), scores
        assert 0.0 < scores[-2] < 1.0  # holding the object is partial progress


def test_partial_score_counts_state_change(games_root: str) -> None:
    env = ALFWorldEnv(game_files=[_game_of(games_root, "pick_heat_then_place_in_recep")])
    env.reset(seed=0)
    seen = [env.step(cmd)[4]["partial_score"] for cmd in env.walkthrough]
    assert any(abs(s - 1 / 3) < 1e-9 for s in seen)  # held
    assert any(abs(s - 2 / 3) < 1e-9 for s in seen)  # held + hot, not yet placed
    assert seen[-1] == 1.0


def test_truncation_at_max_turns(games_root: str) -> None:
    env = ALFWorldEnv(games_dir=games_root, max_turns=3)
    env.reset(seed=0)
    results = [env.step("look") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_admissible_listing_is_configurable(games_root: str) -> None:
    on = ALFWorldEnv(games_dir=games_root)
    off = ALFWorldEnv(games_dir=games_root, list_admissible=False)
    obs_on, info = on.reset(seed=0)
    obs_off, _ = off.reset(seed=0)
    assert "Admissible commands:" in obs_on and "- look" in obs_on
    assert "Admissible commands:" not in obs_off and obs_off.split("\n\n")[0] == obs_on.split("\n\n")[0]
    assert "look" in info["admissible_commands"]


def test_fork_replays_and_is_independent(games_root: str) -> None:
    env = ALFWorldEnv(game_files=[_game_of(games_root, "pick_two_obj_and_place")])
    env.reset(seed=0)
    half = len(env.walkthrough) // 2
    for cmd in env.walkthrough[:half]:
        obs, *_, info = env.step(cmd)
    twin = env.fork()
    assert twin.actions == env.actions and twin._state["admissible_commands"] == info["admissible_commands"]
    twin.step("fly")  # does not touch the original
    assert len(env.actions) == half
    for cmd in env.walkthrough[half:]:
        _, reward, terminated, _, _ = env.step(cmd)
    assert terminated and reward == 1.0
    for cmd in twin.walkthrough[half:]:
        _, reward, terminated, _, _ = twin.step(cmd)
    assert terminated and reward == 1.0


def test_gymnasium_make_and_bad_options(games_root: str) -> None:
    import envs  # noqa: F401 - registers the ids

    env = gymnasium.make("fr_agents/ALFWorld-v0", games_dir=games_root, split="valid_unseen")
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert env.unwrapped.split == "valid_unseen"
    with pytest.raises(ValueError, match="options\\['game'\\]"):
        env.reset(options={"game": 99})
    with pytest.raises(FileNotFoundError, match="games_dir"):
        ALFWorldEnv(games_dir="/nonexistent/alfworld")
    with pytest.raises(ValueError, match="max_turns"):
        ALFWorldEnv(games_dir=games_root, max_turns=0)


def test_an_ended_episodes_engine_is_reused_and_plays_the_game_from_its_start(games_root: str) -> None:
    """close() hands the loaded engine to the pool; the next env on that game takes it (no load())
    and sees exactly what a freshly loaded engine shows, observations and infos alike."""
    from envs.alfworld.engine import ENGINE_POOL

    game = _game_of(games_root, "pick_and_place_simple")

    def play(env: ALFWorldEnv) -> list:
        obs, info = env.reset(options={"game": game})
        seen = [(obs, info)]
        env.step("<action>go to nowhere 7</action>")  # leave the engine mid-game, off the walkthrough
        obs, info = env.reset(options={"game": game})  # the same env again: its own engine, reset
        seen.append((obs, info))
        for cmd in env.walkthrough:
            seen.append(env.step(cmd))
        return seen

    first = ALFWorldEnv(split="valid_seen", games_dir=games_root)
    fresh = play(first)
    engine = first._tw
    first.close()  # at the end of a won episode
    assert ENGINE_POOL.take(game) is engine  # it was pooled, holding this game
    ENGINE_POOL.give(game, engine)
    second = ALFWorldEnv(split="valid_seen", games_dir=games_root)
    reused = play(second)
    assert second._tw is engine
    assert reused == fresh and reused[-1][2]  # the walkthrough still wins
    second.close()


def test_engine_pool_counts_hits_and_misses_keeps_the_newest_and_clears() -> None:
    """The pool is an LRU by return order: beyond its capacity the least recently returned engine is
    closed; take() counts a hit or a miss; clear() closes every idle engine."""
    from envs.alfworld.engine import EnginePool, make_textworld_env

    pool = EnginePool(capacity=2)
    engines = [make_textworld_env() for _ in range(3)]
    for i, engine in enumerate(engines):
        pool.give(f"game{i}.tw-pddl", engine)
    assert len(pool) == 2
    assert pool.take("game0.tw-pddl") is None  # evicted (and closed): the least recently returned
    assert pool.take("game2.tw-pddl") is engines[2] and pool.take("game1.tw-pddl") is engines[1]
    assert (pool.hits, pool.misses) == (2, 1) and len(pool) == 0
    pool.give("game1.tw-pddl", engines[1])
    pool.clear()
    assert len(pool) == 0 and pool.take("game1.tw-pddl") is None and (pool.hits, pool.misses) == (2, 2)
    engines[2].close()


def test_gymnasium_check_env_passes_without_a_warning(games_root: str) -> None:
    """gymnasium's own checker, render check included, on the registered env: no warning at all
    (the engine reads game files itself, so none is left open for the garbage collector)."""
    import gc
    import warnings

    import gymnasium
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = gymnasium.make(
            "fr_agents/ALFWorld-v0", games_dir=games_root, list_admissible=False, render_mode="ansi"
        )
        check_env(env.unwrapped)
        env.close()
        gc.collect()
    assert [str(w.message) for w in caught] == []
