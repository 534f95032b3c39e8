"""A persistent pool of math-verify worker processes with a hard deadline per check.

Why processes, and why our own pool:

* math-verify guards itself with ``signal.alarm``, which works only in a process's main thread,
  and the trainer runs env steps from many threads. So every check runs in a worker process
  (:mod:`envs.verify_worker`), started with ``subprocess`` (no fork of a threaded parent and no
  re-import of the user's ``__main__``, which ``multiprocessing``'s spawn would do).
* A check can hang inside C code where no signal is delivered. ``concurrent.futures`` cannot kill
  one stuck worker, so each worker here has its own pipe: the caller waits on that pipe until the
  hard deadline, then kills the worker, starts a replacement, and reports ``reason="timeout"``.
* A pool that cannot check at all (a worker that does not start, a pipe that breaks before the
  request is read, a reply that is not the protocol) raises
  :class:`fr_agents.errors.InfrastructureFailure` (``verifier_pool``): that is no verdict on the
  answer. A timeout or a worker that dies *during* a check is reported as a verdict
  (``timeout`` / ``worker_died``) with the phase it was in, and :meth:`VerifierPool.self_check` lets
  the caller ask whether the pool can check the gold against itself: if it can, the answer was what
  took the time (see ``MathVerifierEnv``).
* Workers stay alive between checks (math-verify and sympy take about a second to import), and two
  fast paths skip the pool entirely: identical normalized strings (always a true positive) and two
  plain integers (compared exactly, as math-verify would).

:class:`VerifierPool` is thread-safe; :func:`shared_pool` gives the process-wide instance envs use.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envs.answer_extract import normalize_simple
from fr_agents.errors import InfrastructureFailure

log = logging.getLogger(__name__)

_INT_RE = re.compile(r"^[+-]?\d{1,60}$")
_STARTUP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check. ``reason`` is ``correct``, ``wrong``, ``timeout``, ``worker_died``,
    ``unparsable``, ``gold_unparsable`` or ``verifier_error: ...``; ``path`` says who decided
    (``exact``, ``integer``, ``math_verify`` or ``killed``); ``phase`` is the part of the check the
    worker was in when it answered (``gold``, ``pred``, ``verify``; empty when the worker was killed
    or died, or for a fast-path verdict)."""

    correct: bool
    reason: str
    seconds: float
    path: str
    phase: str = ""


def fast_verdict(gold: str, pred: str) -> bool | None:
    """Decide without math-verify when that is safe; None means "ask math-verify".

    Identical strings (ignoring whitespace, ``$`` and a final period) are equal answers. Two plain
    integer literals are compared as integers, which is exactly what math-verify does for them.
    """
    g, p = normalize_simple(gold), normalize_simple(pred)
    if g == p and g:
        return True
    if _INT_RE.match(g) and _INT_RE.match(p):
        return int(g) == int(p)
    return None


class _Worker:
    """One ``python -m envs.verify_worker`` process and its pipes."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "envs.verify_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=root,
        )
        self.ready = False

    def _readline(self, timeout_s: float) -> bytes | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout_s, 0.0))
        if not ready:
            return None
        return self.proc.stdout.readline()

    def wait_ready(self) -> None:
        if self.ready:
            return
        line = self._readline(_STARTUP_TIMEOUT_S)
        if not line:
            raise RuntimeError(
                "math-verify worker did not start (is math-verify installed? pip install math-verify)"
            )
        self.ready = True

    def ask(
        self, gold: str, pred: str, inner_s: float, deadline_s: float, spans: list[str] | None = None
    ) -> dict | None:
        """Send one check; the reply, or None when the deadline passed (the worker is then unusable).

        Raises ``OSError`` when the request cannot be written, ``EOFError`` when the worker exits
        before replying and ``ValueError`` when the reply is not a JSON line."""
        assert self.proc.stdin is not None
        request = {"gold": gold, "pred": pred, "t": inner_s, **({"spans": spans} if spans else {})}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(deadline_s)
        if line is None:
            return None
        if not line:
            raise EOFError(f"verifier worker {self.proc.pid} exited during a check")
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            log.warning("verifier worker %d did not exit after SIGKILL", self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


class VerifierPool:
    """``workers`` math-verify processes; :meth:`check` blocks at most ``timeout_s`` (plus queueing).

    ``inner_timeout_s`` (default 0.8 x ``timeout_s``) is the worker's own alarm, which ends most slow
    checks without a kill; the outer ``timeout_s`` is the hard limit at which the worker is killed.
    Workers start on the first check that needs math-verify (or at once with ``eager=True``), so a
    pool that only ever sees fast-path answers (the tiny curriculum) costs no processes.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        inner_timeout_s: float | None = None,
        eager: bool = False,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.inner_timeout_s = float(inner_timeout_s) if inner_timeout_s is not None else 0.8 * self.timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False
        self.stats = {"checks": 0, "fast_path": 0, "pool_checks": 0, "timeouts": 0, "kills": 0}
        self._started = False
        if eager:
            self.start()

    def start(self) -> None:
        """Start the worker processes now (otherwise the first check that needs math-verify does)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for _ in range(self.workers):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        w = _Worker()
        with self._lock:
            self._all.add(w)
        return w

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def check(
        self, gold: str, pred: str, timeout_s: float | None = None, spans: list[str] | None = None
    ) -> Verdict:
        """Is ``pred`` the same answer as ``gold``? Both are already-extracted answer strings.

        ``spans`` (the prompt's math spans) make an equal answer that is one of them up to the order
        of terms, and not the gold's own shape, ``restated`` (see ``envs.verify_worker``)."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        start = time.perf_counter()
        self._count("checks")
        fast = fast_verdict(gold, pred)
        if fast is not None:
            self._count("fast_path")
            path = "exact" if fast and normalize_simple(gold) == normalize_simple(pred) else "integer"
            return Verdict(fast, "correct" if fast else "wrong", time.perf_counter() - start, path)
        return self._ask_pool(gold, pred, timeout_s, start, spans)

    def self_check(self, gold: str, timeout_s: float | None = None) -> bool:
        """Can the pool check ``gold`` against itself within the deadline? (Through a worker, never
        the fast path.) False when it times out, dies or fails in any way: the verifier is unwell."""
        try:
            v = self._ask_pool(gold, gold, timeout_s, time.perf_counter())
        except InfrastructureFailure:
            return False
        return v.correct

    def _ask_pool(
        self, gold: str, pred: str, timeout_s: float | None, start: float, spans: list[str] | None = None
    ) -> Verdict:
        deadline = self.timeout_s if timeout_s is None else float(timeout_s)
        inner = self.inner_timeout_s if timeout_s is None else 0.8 * deadline
        if not self._started:
            self.start()
        worker = self._idle.get()
        try:
            worker.wait_ready()
        except RuntimeError as e:
            self._retire(worker)
            raise InfrastructureFailure("verifier_pool", str(e)) from e
        self._count("pool_checks")
        try:
            reply = worker.ask(gold, pred, inner, deadline, spans)
        except EOFError:  # the worker died on this check: reported, the caller decides whose fault
            self._retire(worker)
            return Verdict(False, "worker_died", time.perf_counter() - start, "killed")
        except (OSError, ValueError) as e:  # broken pipe or garbled reply: no verdict at all
            self._retire(worker)
            raise InfrastructureFailure("verifier_pool", f"math-verify worker failed: {e}") from e
        if reply is None:
            self._count("timeouts")
            self._count("kills")
            log.debug("verifier worker %d passed the %.1fs deadline; killed", worker.proc.pid, deadline)
            self._retire(worker)
            return Verdict(False, "timeout", time.perf_counter() - start, "killed")
        self._idle.put(worker)
        if reply.get("reason") == "timeout":
            self._count("timeouts")
        return Verdict(
            bool(reply["ok"]),
            str(reply["reason"]),
            time.perf_counter() - start,
            "math_verify",
            str(reply.get("phase", "")),
        )

    def _retire(self, worker: _Worker) -> None:
        """Kill ``worker`` and put a fresh one in its place (unless the pool is closing)."""
        worker.kill()
        with self._lock:
            self._all.discard(worker)
        if not self._closed:
            self._idle.put(self._spawn())

    def check_many(self, pairs: list[tuple[str, str]], timeout_s: float | None = None) -> list[Verdict]:
        """Check many (gold, pred) pairs using every worker at once; results keep the input order."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(lambda gp: self.check(gp[0], gp[1], timeout_s), pairs))

    def close(self) -> None:
        """Stop every worker. Idempotent."""
        self._closed = True
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()

    def __deepcopy__(self, memo: dict) -> VerifierPool:
        """A pool is a shared resource (like a connection): copies of an env share it."""
        return self

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: VerifierPool | None = None
_shared_lock = threading.Lock()


def default_workers() -> int:
    """Workers for the shared pool: ``FR_AGENTS_VERIFY_WORKERS`` or min(4, CPU count)."""
    env = os.environ.get("FR_AGENTS_VERIFY_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, min(4, os.cpu_count() or 1))


def shared_pool() -> VerifierPool:
    """The process-wide pool every MathVerifier env uses (created on first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = VerifierPool(workers=default_workers())
            atexit.register(_shared.close)
        return _shared
