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

import atexit
import itertools
import json
import subprocess
import sys
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
    """Seconds spent in the engine by kind of call (``build``, ``load``, ``reset``, ``step``,
    ``plan``), and the calls: what ``benchmarks/alfworld.py --split`` reports as the engine's share
    of a rollout. Every engine call adds to it (one clock read each): an in-process call its time
    under :data:`ENGINE_LOCK`, a call to a :class:`RemoteEngine` its round trip to the worker."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """Time a call made under :data:`ENGINE_LOCK` (taken here)."""
        with ENGINE_LOCK:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.add(kind, time.perf_counter() - t0)

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
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

    workers = 0  # where it runs: in this process (a RemoteEngine: its EngineWorkers' size)

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


def _portable(state: Any) -> dict[str, Any]:
    """What :class:`~envs.alfworld.env.ALFWorldEnv` reads of a game state, as a plain dict (a
    worker sends it back pickled; the whole state also carries the grammar and entity tables)."""
    return {k: state[k] for k in ("feedback", "admissible_commands", "won", "_facts") if k in state}


def _serve() -> None:
    """A worker's loop (``python -m envs.alfworld.engine``): requests ``(engine id, method, args)``
    pickled on stdin, answers ``(ok, value)`` on stdout, until stdin closes. It hosts any number
    of engines, one call at a time."""
    import pickle

    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever the engine prints must not corrupt the answers
    engines: dict[int, TextWorldEngine] = {}
    while True:
        try:
            eid, method, args = pickle.load(inbox)
        except EOFError:
            break
        try:
            if method == "new":
                engines[eid] = TextWorldEngine(*args)
                out: Any = None
            elif method == "close":
                engines.pop(eid).close()
                out = None
            else:
                out = getattr(engines[eid], method)(*args)
                if method == "reset":
                    out = _portable(out)
                elif method == "step":
                    out = (_portable(out[0]), *out[1:])
            answer = (True, out)
        except Exception as e:  # noqa: BLE001 - the caller raises it
            answer = (False, f"{type(e).__name__}: {e}")
        pickle.dump(answer, outbox)
        outbox.flush()


class EngineWorkers:
    """``n`` worker processes that host TextWorld engines for this process's episodes.

    In one process every engine call waits for :data:`ENGINE_LOCK` and for the interpreter lock,
    which the policy's engine thread and the rollout loop also need; in workers the engine's work
    (a reset ~1 s, a step ~0.13 s, mostly TatSu parsing of the grammar's text) runs in parallel with
    them and with each other. Each engine lives in one worker (chosen round-robin); calls to a
    worker are one at a time. The workers are plain subprocesses (a daemonic rollout process may
    start them), each ends when its pipe closes."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self._procs = [
            subprocess.Popen(
                [sys.executable, "-m", "envs.alfworld.engine"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=str(Path(__file__).resolve().parents[2]),
            )
            for _ in range(n)
        ]
        self._locks = [threading.Lock() for _ in range(n)]
        self._ids = itertools.count()
        self._turn = itertools.count()

    def __len__(self) -> int:
        return len(self._procs)

    def new_engine(self, facts: bool) -> RemoteEngine:
        return RemoteEngine(self, next(self._turn) % len(self._procs), next(self._ids), facts)

    def call(self, worker: int, eid: int, method: str, *args: Any) -> Any:
        import pickle

        proc = self._procs[worker]
        with self._locks[worker]:
            if proc.poll() is not None:
                raise RuntimeError(f"ALFWorld engine worker {worker} exited with code {proc.returncode}")
            pickle.dump((eid, method, args), proc.stdin)
            proc.stdin.flush()
            try:
                ok, out = pickle.load(proc.stdout)
            except EOFError:
                raise RuntimeError(f"ALFWorld engine worker {worker} died during {method}") from None
        if not ok:
            raise RuntimeError(f"ALFWorld engine worker {worker}: {method} failed: {out}")
        return out

    def close(self) -> None:
        for proc in self._procs:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc in self._procs:
            if proc.stdout:
                proc.stdout.close()


class RemoteEngine:
    """:class:`TextWorldEngine`'s interface, the engine itself in a worker of :class:`EngineWorkers`
    (its ``reset``/``step`` states are the dicts of :func:`_portable`)."""

    def __init__(self, workers: EngineWorkers, worker: int, eid: int, facts: bool) -> None:
        self._workers, self._worker, self._id = workers, worker, eid
        self.workers = len(workers)
        self._call("build", "new", facts)

    def _call(self, kind: str, method: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._workers.call(self._worker, self._id, method, *args)
        finally:
            ENGINE_CLOCK.add(kind, time.perf_counter() - t0)

    def load(self, game: str | dict) -> None:
        self._call("load", "load", game)

    def reset(self) -> Any:
        return self._call("reset", "reset")

    def step(self, command: str) -> tuple[Any, float, bool]:
        return self._call("step", "step", command)

    def plan(self) -> list[str]:
        return self._call("plan", "plan")

    def close(self) -> None:
        self._call("close", "close")


_WORKERS: dict[int, EngineWorkers] = {}
_WORKERS_LOCK = threading.Lock()


def engine_workers(n: int) -> EngineWorkers:
    """This process's :class:`EngineWorkers` of ``n`` workers (started on first use, ended at exit)."""
    with _WORKERS_LOCK:
        if n not in _WORKERS:
            _WORKERS[n] = EngineWorkers(n)
            if len(_WORKERS) == 1:
                atexit.register(_close_workers)
        return _WORKERS[n]


def _close_workers() -> None:
    ENGINE_POOL.clear()
    with _WORKERS_LOCK:
        for workers in _WORKERS.values():
            workers.close()
        _WORKERS.clear()


POOL_CAPACITY = 128
"""Idle loaded engines :data:`ENGINE_POOL` keeps in one process (up to ~1.3 GB; see the module docstring)."""


class EnginePool:
    """Idle engines by game file (see the module docstring): :meth:`take` hands out the most recently
    returned engine of a game; beyond ``capacity`` the least recently returned one is closed."""

    def __init__(self, capacity: int = POOL_CAPACITY) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._idle: OrderedDict[int, tuple[str, TextWorldEngine | RemoteEngine]] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()

    def take(self, game_file: str, workers: int = 0) -> TextWorldEngine | RemoteEngine | None:
        """An idle engine that holds ``game_file`` (removed from the pool), in this process
        (``workers`` 0) or in this process's ``workers`` workers, else None; counted in
        :attr:`hits` / :attr:`misses`."""
        with self._lock:
            for key, (game, engine) in reversed(self._idle.items()):
                if game == game_file and engine.workers == workers:
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

    def give(self, game_file: str, engine: TextWorldEngine | RemoteEngine) -> None:
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


def make_textworld_env(facts: bool = False, workers: int = 0) -> TextWorldEngine | RemoteEngine:
    """A fresh engine (one game at a time; ``load`` then ``reset``): a :class:`TextWorldEngine` in
    this process, or with ``workers`` > 0 a :class:`RemoteEngine` in one of this process's
    :func:`engine_workers`."""
    return engine_workers(workers).new_engine(facts) if workers > 0 else TextWorldEngine(facts)


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


if __name__ == "__main__":
    _serve()
