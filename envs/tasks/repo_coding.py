"""Repository coding tasks as tasks (``tasks.source: repo-coding``), for ``fr_agents/RepoCoding-v0``.

Each task is one :class:`~envs.repo_coding.task.RepoTask`: ``id`` is its ``instance_id`` (what the
env picks when reset with ``options={"task": task}``), ``prompt`` the issue text, ``answer`` the
gold patch (the env's hidden tests, not this answer, score episodes), ``metadata`` its ``repo``.

The task set is the env's default (the project's seed repositories, built on first use) or the
JSONL/parquet file or folder in ``tasks``; give the env the same set (``env.kwargs.tasks``) when
you change it. Held-out split: with ``test_repos``, every task of those repositories (unseen code);
otherwise a seeded ``test_fraction`` of the tasks.

Parameters: ``tasks``, ``test_repos``, ``test_fraction`` (default 0.25).
"""

from __future__ import annotations

from pathlib import Path

from envs.tasks.base import Task, TaskSource, holdout, make_task
from fr_agents.config import ConfigError


class RepoCodingSource(TaskSource):
    """RepoCoding-v0 tasks with a held-out split (see the module docstring)."""

    name = "repo-coding"

    def __init__(
        self,
        seed: int = 0,
        tasks: str | None = None,
        test_repos: list[str] | None = None,
        test_fraction: float = 0.25,
    ) -> None:
        super().__init__(seed)
        if tasks is not None and not Path(tasks).exists():
            raise ConfigError(f"tasks.params.tasks: no such file or folder {tasks}")
        self.tasks_path, self.test_repos, self.test_fraction = tasks, test_repos, test_fraction
        self._splits: tuple[list[Task], list[Task]] | None = None

    def all_tasks(self) -> list[Task]:
        from envs.repo_coding.task import load_tasks

        if self.tasks_path is not None:
            repo_tasks = load_tasks(self.tasks_path)
        else:
            from envs.repo_coding.builder import build_tasks
            from envs.repo_coding.env import default_tasks_dir

            repo_tasks = build_tasks(default_tasks_dir(), seed=0, repos=["seed"])
        return [
            make_task(t.instance_id, t.problem_statement, t.patch, repo=t.repo, task_id=t.instance_id)
            for t in repo_tasks
        ]

    def _load_split(self, split: str) -> list[Task]:
        if self._splits is None:
            tasks = self.all_tasks()
            if self.test_repos:
                repos = {t["metadata"]["repo"] for t in tasks}
                missing = sorted(set(self.test_repos) - repos)
                if missing:
                    raise ConfigError(
                        f"tasks.params.test_repos: no task of {', '.join(missing)}; "
                        f"the set has {', '.join(sorted(repos))}"
                    )
                held = set(self.test_repos)
                self._splits = (
                    [t for t in tasks if t["metadata"]["repo"] not in held],
                    [t for t in tasks if t["metadata"]["repo"] in held],
                )
            else:
                self._splits = holdout(tasks, self.seed, test_fraction=self.test_fraction)
        return self._splits[0] if split == "train" else self._splits[1]
