"""ALFWorld-v0 under concurrency: episodes reset and step in several threads at once, as rollout,
eval and training run them, and each plays exactly as it does alone."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.alfworld.generate import find_games
from tests.envs.alfworld.test_expert_cli import _cli

pytestmark = pytest.mark.alfworld
THREADS = 4


def _play(game: str, start: threading.Barrier | None = None) -> list[str]:
    """Reset on ``game`` and follow its walkthrough to the win; the transcript of observations."""
    env = gymnasium.make("fr_agents/ALFWorld-v0", game_files=[game], max_turns=60)
    try:
        if start is not None:
            start.wait(timeout=60)  # every thread enters reset() together
        obs, info = env.reset(seed=0, options={"game": game})
        seen = [obs]
        for cmd in env.unwrapped.walkthrough:
            obs, reward, terminated, truncated, info = env.step(f"<action>{cmd}</action>")
            seen.append(obs)
            if terminated or truncated:
                break
        assert info["won"] and reward == 1.0, f"{game}: the walkthrough did not win under concurrency"
        return seen
    finally:
        env.close()


def test_episodes_reset_and_step_concurrently_as_they_do_alone(games_root: str) -> None:
    games = find_games(games_root, "valid_seen")[:THREADS]
    assert len(games) == THREADS
    alone = [_play(g) for g in games]
    start = threading.Barrier(THREADS)  # loads, resets and steps of four engines interleave
    with ThreadPoolExecutor(THREADS) as pool:
        together = list(pool.map(_play, games, [start] * THREADS))
    assert together == alone, "a concurrent episode saw other observations than alone"


def test_expert_eval_at_default_concurrency_wins_every_game(games_root: str, tmp_path: Path) -> None:
    r = _cli(
        "eval",
        "--agent",
        "expert",
        "--bench",
        "alfworld-unseen",
        "--limit",
        "3",
        "--out",
        str(tmp_path),
        games_root=games_root,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "results.json").read_text())
    (row,) = rows["results"] if isinstance(rows, dict) else rows
    assert row["tasks"] == 3 and row["metrics"]["success"] == 1.0
