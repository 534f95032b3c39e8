"""ALFWorld-v0 with its engine in worker processes (engine_workers=N): the same game as in-process,
several episodes at once across workers, errors named, and no worker outlives its pool."""

from __future__ import annotations

import asyncio

import pytest

from envs.alfworld.engine import EngineWorkers
from envs.alfworld.env import ALFWorldEnv
from envs.alfworld.expert import ExpertAgent

pytestmark = pytest.mark.alfworld


def transcript(env: ALFWorldEnv, game: int) -> list:
    obs, info = env.reset(options={"game": game})
    seen = [(obs, info["partial_score"], info["admissible_commands"])]
    for _ in range(env.max_turns):
        obs, reward, terminated, truncated, info = env.step(ExpertAgent().act(env))
        seen.append((obs, reward, info["partial_score"], info["won"], info["admissible_commands"]))
        if terminated or truncated:
            break
    return seen


def test_a_game_in_a_worker_plays_as_in_this_process(games_root: str) -> None:
    here = ALFWorldEnv(split="valid_unseen", games_dir=games_root, expert="search", max_turns=40)
    there = ALFWorldEnv(
        split="valid_unseen", games_dir=games_root, expert="search", max_turns=40, engine_workers=2
    )
    for game in range(len(here.games)):
        assert transcript(there, game) == transcript(here, game)
    assert there._tw.workers == 2 and here._tw.workers == 0
    here.close()
    there.close()


def test_episodes_in_threads_across_workers_see_what_they_see_alone(games_root: str) -> None:
    alone = [
        transcript(ALFWorldEnv(split="valid_seen", games_dir=games_root, expert="search", max_turns=40), g)
        for g in range(4)
    ]

    async def together() -> list:
        envs = [
            ALFWorldEnv(
                split="valid_seen", games_dir=games_root, expert="search", max_turns=40, engine_workers=2
            )
            for _ in range(4)
        ]
        return await asyncio.gather(*(asyncio.to_thread(transcript, env, g) for g, env in enumerate(envs)))

    assert asyncio.run(together()) == alone


def test_a_failed_call_names_the_worker_and_the_error(games_root: str) -> None:
    workers = EngineWorkers(1)
    try:
        engine = workers.new_engine(facts=False)
        with pytest.raises(RuntimeError, match=r"worker 0: load failed: .*No such file"):
            engine.load("/no/such/game.tw-pddl")
    finally:
        workers.close()
    assert all(p.poll() is not None for p in workers._procs)  # closed: every worker has exited


def test_engine_workers_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="engine_workers must be >= 0"):
        ALFWorldEnv(engine_workers=-1)
