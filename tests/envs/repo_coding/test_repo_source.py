"""`tasks.source: repo-coding`: train/test splits of the task set, and the env resets on a split's task."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.repo_coding.env import RepoCodingEnv
from envs.tasks import get_task_source
from fr_agents.config import ConfigError
from tests.envs.repo_coding.sandbox_params import BACKENDS, require


def test_splits_are_disjoint_and_cover_the_set(seed_tasks_dir: Path) -> None:
    source = get_task_source("repo-coding", seed=0, tasks=str(seed_tasks_dir))
    train, test = source.split("train"), source.split("test")
    ids = {t["id"] for t in train} | {t["id"] for t in test}
    assert len(train) + len(test) == len(ids) == 4  # two repositories, two tasks each
    assert len(test) == 1 and not {t["id"] for t in train} & {t["id"] for t in test}
    task = train[0]
    assert task["prompt"] and task["answer"].startswith("diff --git") and task["metadata"]["repo"]


def test_test_repos_hold_out_whole_repositories(seed_tasks_dir: Path) -> None:
    source = get_task_source("repo-coding", tasks=str(seed_tasks_dir), test_repos=["seed:intervals"])
    assert {t["metadata"]["repo"] for t in source.split("test")} == {"seed:intervals"}
    assert {t["metadata"]["repo"] for t in source.split("train")} == {"seed:textkit"}
    with pytest.raises(ConfigError, match=r"tasks\.params\.test_repos: no task of nope"):
        get_task_source("repo-coding", tasks=str(seed_tasks_dir), test_repos=["nope"]).split("test")
    with pytest.raises(ConfigError, match=r"tasks\.params\.tasks"):
        get_task_source("repo-coding", tasks="/no/such/tasks.jsonl")


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_resets_on_the_task_it_is_given(backend: str, seed_tasks_dir: Path) -> None:
    task = get_task_source("repo-coding", tasks=str(seed_tasks_dir)).split("test")[0]
    env = RepoCodingEnv(tasks=str(seed_tasks_dir), backend=require(backend))
    try:
        _obs, info = env.reset(seed=0, options={"task": dict(task)})
        assert info["instance_id"] == task["id"]
    finally:
        env.close()
