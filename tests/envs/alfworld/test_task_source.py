"""`tasks.source: alfworld`: ALFWorld's splits as tasks, and the env plays the game a task names."""

from __future__ import annotations

import gymnasium
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.tasks import get_task_source
from fr_agents.config import ConfigError

pytestmark = pytest.mark.alfworld


def test_splits_are_alfworlds_and_the_env_plays_the_named_game(games_root: str) -> None:
    source = get_task_source("alfworld", games_dir=games_root)
    seen, unseen = source.split("valid_seen"), source.split("valid_unseen")
    assert len(seen) == len(unseen) == 6
    assert [t["id"] for t in source.split("test")] == [t["id"] for t in unseen]
    assert not {t["id"] for t in seen} & {t["id"] for t in unseen}
    assert {t["metadata"]["split"] for t in unseen} == {"valid_unseen"}
    assert len({t["metadata"]["task_type"] for t in seen}) == 6  # one game of each type
    assert len(get_task_source("alfworld", games_dir=games_root, limit=3).split("valid_seen")) == 3
    task = unseen[0]
    env = gymnasium.make("fr_agents/ALFWorld-v0")
    try:
        obs, info = env.reset(seed=0, options={"task": dict(task)})
        assert info["game_file"] == task["metadata"]["game"]
        assert task["prompt"] in obs
    finally:
        env.close()


def test_a_games_dir_without_the_split_is_refused(games_root: str) -> None:
    with pytest.raises(ConfigError, match=r"tasks\.params\.games_dir: no train games"):
        get_task_source("alfworld", games_dir=games_root).split("train")
    with pytest.raises(ConfigError, match=r"tasks\.params\.task_types: unknown nope"):
        get_task_source("alfworld", task_types=["nope"])


def test_splits_list_games_round_robin_over_task_types() -> None:
    """Any prefix of a split covers the types evenly: the warm start's demos are a prefix."""
    from envs.tasks.alfworld import round_robin
    from envs.tasks.base import make_task

    tasks = [
        make_task(f"{t}/{i}", "goal", "", task_type=t)
        for t, n in (("b", 3), ("a", 2), ("c", 1))
        for i in range(n)
    ]
    assert [t["id"] for t in round_robin(tasks)] == ["a/0", "b/0", "c/0", "a/1", "b/1", "b/2"]
