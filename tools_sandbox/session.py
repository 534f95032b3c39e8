"""The backend-independent half of a sandbox session: calls, deadlines, restarts, clean-up.

A :class:`Sandbox` owns one *worker* (see :mod:`tools_sandbox.worker`) at a time, reached through a
:class:`Transport` (pipes for bubblewrap, the Docker attach socket for Docker). Every call:

1. starts a worker if there is none (the first call after a kill pays the start);
2. sends one request frame and waits for the response **until a hard deadline** measured on the host,
   so no code, not even a C loop that never checks for signals, can hold the caller longer;
3. on a missed deadline, a dead worker, an OOM kill or pid exhaustion, kills the worker (the next call
   starts a fresh one) and returns a :class:`RunResult` whose ``status`` says what happened and whose
   ``restarted`` is True: the Python state is gone.

Clean-up is guaranteed three ways: ``close()`` (also via ``with``), and a ``weakref.finalize`` that
runs when the object is garbage-collected or, at the latest, when the interpreter exits. Whatever survives a
hard crash of this process is removed by the reaper (:mod:`tools_sandbox.reaper`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from tools_sandbox.limits import SandboxLimits
from tools_sandbox.result import RunResult, SandboxError, SandboxTimeout
from tools_sandbox.worker import MAX_STDIN, decode_header, encode_frame

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # "nobody": the user code runs as, in every backend
WORKER_SOURCE = (Path(__file__).with_name("worker.py")).read_text()  # handed to ``python3 -c``
SANDBOX_ENV = {  # the whole environment inside a sandbox: nothing of the host's leaks in
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/work",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}


class WorkerGone(Exception):
    """The worker's stream ended (it died, or was killed)."""


class DeadlinePassed(Exception):
    """No complete response before the deadline."""


class Transport:
    """A byte stream to one worker. Backends implement the three methods."""

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def recv(self, wait_s: float) -> bytes | None:
        """Up to a chunk of the worker's stdout; ``None`` if nothing came within ``wait_s``, ``b""``
        at EOF."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SessionState:
    """What must be torn down when a session ends. Kept apart from the :class:`Sandbox` object so a
    ``weakref.finalize`` can tear it down after the session object itself was garbage-collected."""

    def kill_worker(self) -> None:
        """Kill the current worker quickly (must not block for long)."""

    def release(self) -> None:
        """Free everything else (containers, cgroups); called once, at the very end."""


def _finalize(state: SessionState) -> None:
    try:
        state.kill_worker()
    finally:
        state.release()


class FrameReader:
    """Reassembles frames from a :class:`Transport`, never waiting past a deadline."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.buf = bytearray()

    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlinePassed
            chunk = self.transport.recv(left)
            if chunk is None:
                continue
            if not chunk:
                raise WorkerGone
            self.buf += chunk

    def read(self, deadline: float) -> dict:
        import json

        self._fill(4, deadline)
        n = decode_header(bytes(self.buf[:4]))
        self._fill(4 + n, deadline)
        body = bytes(self.buf[4 : 4 + n])
        del self.buf[: 4 + n]
        return json.loads(body)


# Every open session (for introspection: ``live_sessions()``); tear-down is the finalizers' job.
_LIVE: weakref.WeakSet = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def live_sessions() -> list[Sandbox]:
    """The sessions of this process that are not closed yet."""
    with _LIVE_LOCK:
        return [sb for sb in _LIVE if not sb.closed]


class Sandbox:
    """One isolated session with a persistent Python worker. Create through :func:`open_sandbox`.

    Methods are thread-safe (calls on one session are serialised). ``timeout`` defaults to
    ``limits.call_timeout``.
    """

    backend = "?"

    def __init__(self, limits: SandboxLimits | None, state: SessionState) -> None:
        self.limits = limits or SandboxLimits()
        self._state = state
        # Runs on close(), on garbage collection, and at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _finalize, state)
        self._lock = threading.RLock()
        self._transport: Transport | None = None
        self._reader: FrameReader | None = None
        self._closed = False
        self._seen: tuple[int, int] = (0, 0)  # cgroup (oom, pids) counters after the last call
        self.starts = 0  # how many workers this session has started (1 + restarts)
        self.calls = 0
        with _LIVE_LOCK:
            _LIVE.add(self)

    # ------------------------------------------------------------------ backend hooks

    def _spawn(self) -> Transport:
        """Start a worker; return its transport. The ready frame is read by the caller."""
        raise NotImplementedError

    def _kill(self) -> None:
        self._state.kill_worker()

    def _death_cause(self) -> str | None:
        """After the worker died: ``"oom"``/``"pids"`` when the backend can tell, else None."""
        return None

    def _counters(self) -> tuple[int, int]:
        """(oom kills, pids-limit hits) so far, when the backend can see its cgroup; else (0, 0)."""
        return (0, 0)

    def _release(self) -> None:
        self._finalizer()

    def _alive(self) -> bool:
        return self._transport is not None

    def worker_config(self) -> dict[str, Any]:
        """The JSON config handed to the worker."""
        lim = self.limits
        return {
            "output_bytes": lim.output_bytes,
            "pids": lim.pids,
            "nofile": lim.nofile,
            "workdir": "/work",
            "kill_strays": True,
            "rlimits": {"nofile": lim.nofile, "fsize": lim.tmpfs_mb << 20, "core": 0},
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Sandbox:
        """Start the worker now (normally lazy). Returns self."""
        with self._lock:
            self._ensure_worker()
        return self

    def _ensure_worker(self) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed")
        if self._transport is not None:
            return
        t0 = time.monotonic()
        try:
            transport = self._spawn()
        except SandboxError:
            raise
        except Exception as e:
            self._kill()
            raise SandboxError(f"{self.backend} worker could not start: {type(e).__name__}: {e}") from e
        reader = FrameReader(transport)
        try:
            hello = reader.read(t0 + self.limits.start_timeout)
        except (DeadlinePassed, WorkerGone, ValueError, OSError) as e:
            self._transport = transport
            self._drop_worker()
            raise SandboxError(
                f"{self.backend} worker did not start: {type(e).__name__} {self._start_failure()}"
            ) from e
        if not hello.get("ready"):
            self._transport = transport
            self._drop_worker()
            raise SandboxError(f"{self.backend} worker sent {hello!r} instead of ready")
        self._transport, self._reader = transport, reader
        self._seen = self._counters()
        self.starts += 1
        log.debug("%s worker ready in %.3f s", self.backend, time.monotonic() - t0)

    def _start_failure(self) -> str:
        return ""

    def _drop_worker(self) -> None:
        if self._transport is None:
            return
        try:
            self._kill()
        finally:
            with contextlib.suppress(OSError):
                self._transport.close()
            self._transport, self._reader = None, None

    def restart(self) -> None:
        """Kill the worker; the next call starts a fresh one (empty state)."""
        with self._lock:
            self._drop_worker()

    def close(self) -> None:
        """Kill the worker and free every resource. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._drop_worker()
            finally:
                self._release()
                with _LIVE_LOCK:
                    _LIVE.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        """True when the session is open and its worker is running."""
        return not self._closed and self._alive()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {'closed' if self._closed else 'open'}>"

    # ------------------------------------------------------------------ the call

    def _request(self, req: dict, timeout: float | None) -> tuple[dict | None, str | None, float]:
        """Send ``req``; return (response, failure status, seconds). On failure the worker is gone."""
        timeout = self.limits.call_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        with self._lock:
            self._ensure_worker()
            assert self._transport is not None and self._reader is not None
            self.calls += 1
            before = self._seen
            t0 = time.monotonic()
            # A random id per request: code that forges response frames (it can write to the
            # worker's stdout) cannot prepare answers for later calls.
            req = {**req, "id": os.urandom(8).hex()}
            try:
                self._transport.send(encode_frame(req))
                resp = self._reader.read(t0 + timeout)
                while resp.get("id") != req["id"]:  # a frame forged by the code itself: not our answer
                    log.debug("%s: dropped a frame with id %r", self.backend, resp.get("id"))
                    resp = self._reader.read(t0 + timeout)
            except DeadlinePassed:
                self._drop_worker()
                return None, self._cause(before) or "timeout", time.monotonic() - t0
            except (WorkerGone, OSError, ValueError) as e:
                log.debug("%s worker lost: %r", self.backend, e)
                cause = self._death_cause()
                self._drop_worker()
                return None, cause or self._cause(before) or "crashed", time.monotonic() - t0
            elapsed = time.monotonic() - t0
            cause = self._cause(before)
            if cause is not None:
                resp["status"], resp["restart"] = cause, True
            if resp.get("restart"):
                self._drop_worker()
            return resp, None, elapsed

    def _cause(self, before: tuple[int, int]) -> str | None:
        """ "oom"/"pids" when the cgroup counters moved since ``before`` (the last call)."""
        self._seen = (oom, pids) = self._counters()
        if oom > before[0]:
            return "oom"
        if pids > before[1]:
            return "pids"
        return None

    def _run(self, req: dict, timeout: float | None) -> RunResult:
        resp, failure, elapsed = self._request(req, timeout)
        if failure is not None:
            res = RunResult(
                "",
                "",
                None,
                timed_out=failure == "timeout",
                status=failure,
                restarted=True,
                duration_s=elapsed,
            )
            res.stderr = res.describe()
            return res
        assert resp is not None
        res = RunResult(
            stdout=resp.get("stdout", ""),
            stderr=resp.get("stderr", ""),
            exit_code=resp.get("exit_code"),
            status=resp.get("status", "error"),
            restarted=bool(resp.get("restart")),
            truncated=bool(resp.get("truncated")),
            duration_s=elapsed,
        )
        if res.restarted:
            note = res.describe()
            if resp.get("error"):
                note += f" ({resp['error']})"
            res.stderr = (res.stderr + "\n" if res.stderr else "") + note
        return res

    def run_python(self, code: str, timeout: float | None = None) -> RunResult:
        """Run ``code`` in the session's persistent namespace (a final expression is echoed)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        return self._run({"op": "python", "code": code}, timeout)

    def run_shell(self, cmd: str, timeout: float | None = None, stdin: bytes | None = None) -> RunResult:
        """Run ``/bin/sh -c cmd`` in the work directory. ``stdin`` (at most 16 KiB) is what the command
        reads on its standard input (else ``/dev/null``); it appears in no argv, environment or file."""
        if not isinstance(cmd, str):
            raise TypeError(f"cmd must be a str, got {type(cmd).__name__}")
        req: dict[str, Any] = {"op": "shell", "cmd": cmd}
        if stdin is not None:
            if not isinstance(stdin, bytes) or len(stdin) > MAX_STDIN:
                raise ValueError(f"stdin: expected bytes of at most {MAX_STDIN}, got {type(stdin).__name__}")
            req["stdin"] = base64.b64encode(stdin).decode("ascii")
        return self._run(req, timeout)

    def _file_request(self, req: dict, timeout: float | None) -> dict:
        resp, failure, _ = self._request(req, timeout)
        if failure is not None:
            if failure == "timeout":
                raise SandboxTimeout(f"{req['op']} {req['path']!r} timed out; the worker was restarted")
            raise SandboxError(f"{req['op']} {req['path']!r} failed: worker {failure}; it was restarted")
        assert resp is not None
        if resp.get("status") != "ok":
            raise SandboxError(f"{req['op']} {req['path']!r}: {resp.get('error', resp.get('status'))}")
        return resp

    def write_file(self, path: str, data: bytes | str, timeout: float | None = None) -> None:
        """Write ``data`` to ``path`` (relative paths are under ``/work``; parents are created)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._file_request(
            {"op": "write", "path": path, "data": base64.b64encode(data).decode("ascii")}, timeout
        )

    def read_file(self, path: str, timeout: float | None = None, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        """The bytes of ``path`` (relative paths are under ``/work``)."""
        resp = self._file_request({"op": "read", "path": path, "max_bytes": max_bytes}, timeout)
        return base64.b64decode(resp["data"])

    def ping(self, timeout: float = 5.0) -> bool:
        resp, failure, _ = self._request({"op": "ping"}, timeout)
        return failure is None and bool(resp and resp.get("pong"))
