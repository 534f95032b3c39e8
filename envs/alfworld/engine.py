"""ALFWorld's own TextWorld engine, assembled the way ``alfworld`` does it.

A ``game.tw-pddl`` file (JSON: ``pddl_domain``, ``grammar``, ``pddl_problem``, ``solvable``,
``walkthrough``) is played by ``textworld.envs.PddlEnv`` (Fast Downward applies the PDDL actions and
lists the applicable ones) wrapped by ``AlfredDemangler`` (``apple_bar_7_bar_1`` -> ``apple 1``) and
``AlfredInfos`` from ``alfworld.agents.environment.alfred_tw_env``. Nothing here re-implements game
logic: this module only builds that stack and exposes the planner and the fact list.

Threads. The engine is not thread-safe, and the training loop, ``fr-agents rollout`` and
``fr-agents eval`` all run ALFWorld episodes concurrently (``reset``/``step`` in worker threads).
Three things inside it are shared by every env of a process:

* ``textworld.envs.pddl.logic._PARSER``, one TatSu parser object for the game grammar, used by
  ``load()``;
* ``textworld.envs.pddl.textgen._PARSER``, one TatSu parser used by ``ContextSensitiveGrammar.derive``,
  i.e. by every ``reset()`` and ``step()`` (the intro, each feedback line and every admissible
  command are derived); a TatSu parser keeps its parse state (rule and position stacks) on the object,
  so two parses at once pop each other's stacks (``IndexError: pop from empty list``);
* ``fast_downward.pddl2sas``, run by every ``load()`` and ``reset()``, rewrites ``sys.argv`` and the
  translator's module-level ``options`` (two settings per call) before translating.

(The Fast Downward library itself is per env: ``fast_downward.load_lib`` loads a private copy.)

:class:`TextWorldEngine` therefore runs every call into the stack under one process-wide lock. An
engine call takes milliseconds while a policy's reply takes far longer, so episodes still overlap
where it matters; processes (``fr-agents alfworld generate --workers``) are unaffected.

Reuse. ``load()`` builds the game's logic and a first PDDL state, the larger part of a reset (2.6 s
for a fresh engine against 1.0 s for a ``reset()`` of one that already holds the game, measured on a
busy 2-core machine), and a later ``reset()`` of the same engine plays the game from its start with
the same observations (``tests/envs/alfworld/test_env.py`` checks this). :data:`ENGINE_POOL` keeps
engines whose episode ended, per game, so that the next episode of that game (training revisits its
games; every held-out evaluation replays the same ones) skips ``load()``. It holds at most
:data:`POOL_CAPACITY` engines (6-10 MB each) and closes the least recently returned beyond that.

Its size. Training visits its RL games in a fresh seeded permutation each epoch, so a pool smaller
than the number of games misses most revisits (LRU under a near-cyclic order); 128 covers every
revisit of alfworld-tiny's schedule (48 RL games), where 32 hits about a quarter of its resets
(``benchmarks/alfworld.py --schedule``; figures in docs/measurements.md). The same holds in the
learner's process, where the held-out games are replayed after the warm start's demo games.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def data_files() -> tuple[str, str]:
    """The PDDL domain and the TextWorld grammar shipped in the ``alfworld`` wheel."""
    import alfworld

    root = Path(alfworld.__file__).parent / "data"
    return (root / "alfred.pddl").read_text(), (root / "alfred.twl2").read_text()


ENGINE_LOCK = threading.RLock()
"""Held by every call into TextWorld's PDDL engine in this process (see the module docstring)."""


class EngineClock:
    """Seconds spent inside the engine, under :data:`ENGINE_LOCK`, by kind of call (``load``,
    ``reset``, ``step``, ``plan``), and the calls: what ``benchmarks/alfworld.py --split`` reports as
    the engine's share of a rollout. Every engine call adds to it (one clock read each)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        with ENGINE_LOCK:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t0
                self.calls[kind] = self.calls.get(kind, 0) + 1

    def total(self) -> float:
        return sum(self.seconds.values())

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()


ENGINE_CLOCK = EngineClock()
"""This process's :class:`EngineClock`."""


def _build_stack(facts: bool) -> Any:
    try:
        import fast_downward  # noqa: F401
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
    except ImportError as e:
        raise ImportError(
            f"ALFWorld needs alfworld, textworld and fast-downward-textworld ({e}); "
            "run: bash scripts/install_alfworld.sh"
        ) from e

    infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=facts, extras=["gamefile"])
    env = PddlEnv(infos)
    env = AlfredDemangler(env, shuffle=False)
    return AlfredInfos(env)


class TextWorldEngine:
    """PddlEnv + AlfredDemangler + AlfredInfos (admissible commands and ``won`` requested), with
    every call made under :data:`ENGINE_LOCK`. ``load``/``reset``/``step`` behave as TextWorld's;
    :meth:`plan` is Fast Downward's plan from the current state."""

    def __init__(self, facts: bool = False) -> None:
        with ENGINE_CLOCK.timed("build"):
            self._env = _build_stack(facts)

    def load(self, game: str | dict) -> None:
        """Load a ``game.tw-pddl`` (path or parsed). A path is read here: ``PddlEnv.load`` would
        ``json.load(open(path))`` and leave the file to the garbage collector (a ResourceWarning)."""
        if not isinstance(game, dict):
            game = json.loads(Path(game).read_text())
        with ENGINE_CLOCK.timed("load"):
            self._env.load(game)

    def reset(self) -> Any:
        with ENGINE_CLOCK.timed("reset"):
            return self._env.reset()

    def step(self, command: str) -> tuple[Any, float, bool]:
        with ENGINE_CLOCK.timed("step"):
            return self._env.step(command)

    def plan(self) -> list[str]:
        """Fast Downward's plan from the current state, as game commands ([] when none exists).

        This is what ``PddlEnv`` computes for ``EnvInfos(policy_commands=True)`` (and what ALFWorld's
        ``AlfredExpert(expert_type="planner")`` returns); calling it on demand avoids re-planning after
        every step.
        """
        with ENGINE_CLOCK.timed("plan"):
            inner = pddl_env(self._env)
            return list(inner._pddl_state.replan(inner._entity_infos))

    def close(self) -> None:
        with ENGINE_LOCK:
            self._env.close()


POOL_CAPACITY = 128
"""Idle loaded engines :data:`ENGINE_POOL` keeps in one process (up to ~1.3 GB; see the module docstring)."""


class EnginePool:
    """Idle engines by game file (see the module docstring): :meth:`take` hands out the most recently
    returned engine of a game; beyond ``capacity`` the least recently returned one is closed."""

    def __init__(self, capacity: int = POOL_CAPACITY) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._idle: OrderedDict[int, tuple[str, TextWorldEngine]] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()

    def take(self, game_file: str) -> TextWorldEngine | None:
        """An idle engine that holds ``game_file`` (removed from the pool), else None; counted in
        :attr:`hits` / :attr:`misses`."""
        with self._lock:
            for key, (game, engine) in reversed(self._idle.items()):
                if game == game_file:
                    del self._idle[key]
                    self.hits += 1
                    return engine
            self.misses += 1
        return None

    def clear(self) -> None:
        """Close every idle engine (the counters stay)."""
        with self._lock:
            idle = [engine for _, engine in self._idle.values()]
            self._idle.clear()
        for engine in idle:
            engine.close()

    def give(self, game_file: str, engine: TextWorldEngine) -> None:
        """Keep ``engine`` (which holds ``game_file``) for a later episode of that game."""
        evicted = []
        with self._lock:
            self._idle[self._next] = (game_file, engine)
            self._next += 1
            while len(self._idle) > self.capacity:
                evicted.append(self._idle.popitem(last=False)[1][1])
        for old in evicted:
            old.close()

    def __len__(self) -> int:
        return len(self._idle)


ENGINE_POOL = EnginePool()
"""The process's pool of idle loaded engines (:class:`EnginePool`)."""


def make_textworld_env(facts: bool = False) -> TextWorldEngine:
    """A fresh :class:`TextWorldEngine` (one game at a time; ``load`` then ``reset``)."""
    return TextWorldEngine(facts)


def pddl_env(tw_env: Any) -> Any:
    """The innermost ``PddlEnv`` of a wrapper stack."""
    env = tw_env
    while hasattr(env, "_wrapped_env") and env._wrapped_env is not None:
        env = env._wrapped_env
    return env


def plan(engine: TextWorldEngine) -> list[str]:
    """:meth:`TextWorldEngine.plan` (kept as a function for the expert and the generator)."""
    return engine.plan()


def task_types() -> tuple[str, ...]:
    from envs.alfworld.sampling import TASK_TYPES

    return TASK_TYPES

