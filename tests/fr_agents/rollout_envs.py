"""Small real text envs for the rollout tests (importable as ``rollout_envs:fr_agents_test/…``)."""

from __future__ import annotations

from typing import Any

import gymnasium

from fr_agents.spaces import AnyText


class CountEnv(gymnasium.Env):
    """A deterministic multi-turn text env.

    The task names a target word count; each turn the observation reports how many words the
    action had, reward is 1.0 on a hit, and the episode terminates after ``turns`` steps.
    ``partial_score`` is the fraction of turns played.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns
        self.observation_space = AnyText(4096)
        self.action_space = AnyText(65536)
        self.t = 0
        self.target = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        self.target = int(task) if task is not None else int(self.np_random.integers(1, 6))
        self.t = 0
        return f"Write exactly {self.target} words.", {"partial_score": 0.0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.t += 1
        words = len(action.split())
        reward = 1.0 if words == self.target else 0.0
        noise = int(self.np_random.integers(0, 100))
        obs = f"Turn {self.t}: you wrote {words} words (code {noise}). Again."
        done = self.t >= self.turns
        return obs, reward, done, False, {"partial_score": self.t / self.turns}


class ForkableCountEnv(CountEnv):
    """CountEnv with an explicit ``fork()`` (copies the RNG state too)."""

    forks = 0

    def fork(self) -> ForkableCountEnv:
        import copy

        ForkableCountEnv.forks += 1
        twin = ForkableCountEnv(self.turns)
        twin.t, twin.target = self.t, self.target
        twin._np_random = copy.deepcopy(self.np_random)
        return twin


class IntObsEnv(CountEnv):
    """Breaks the contract: returns an int observation."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed, options=options)
        return 42, {}


for _id, _cls in (
    ("fr_agents_test/Count-v0", "CountEnv"),
    ("fr_agents_test/ForkCount-v0", "ForkableCountEnv"),
    ("fr_agents_test/IntObs-v0", "IntObsEnv"),
):
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=f"rollout_envs:{_cls}", disable_env_checker=True)
