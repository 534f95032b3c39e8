"""A warm pool of pre-started sessions, so an episode does not wait for a worker to start.

``acquire()`` hands out a session that has **never run anything**; the caller owns it and closes it
when its episode ends. Sessions never go back to the pool (state, files or processes of one episode
must never reach another). A background thread keeps ``size`` fresh sessions ready.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from tools_sandbox.factory import create_sandbox, resolve_backend
from tools_sandbox.limits import SandboxLimits
from tools_sandbox.session import Sandbox

log = logging.getLogger(__name__)


class SandboxPool:
    """Keeps ``size`` started sessions of one backend and limits ready to hand out."""

    def __init__(
        self,
        backend: str = "auto",
        limits: SandboxLimits | None = None,
        size: int = 2,
        *,
        image: str | None = None,
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"pool size must be an int >= 1, got {size!r}")
        self.backend = resolve_backend(backend, image)
        self.limits = limits or SandboxLimits()
        self.size = size
        self.image = image
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._failures = 0
        self.handed_out = 0
        self._thread = threading.Thread(
            target=self._fill, name=f"fr-sandbox-pool-{self.backend}", daemon=True
        )
        self._thread.start()

    def _new(self) -> Sandbox:
        return create_sandbox(self.backend, self.limits, image=self.image, start=True)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._idle) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                sb = self._new()
                self._failures = 0
            except Exception as e:  # noqa: BLE001 - retry with back-off; acquire() reports errors itself
                self._failures += 1
                log.warning("sandbox pool could not start a session (%s); retrying", e)
                time.sleep(min(30.0, 0.5 * 2**self._failures))
                continue
            with self._cond:
                if self._closed:
                    sb.close()
                    return
                self._idle.append(sb)
                self._cond.notify_all()

    def acquire(self, wait_s: float = 0.0) -> Sandbox:
        """A fresh, started session (from the pool, or started now if none is ready within ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            if self._closed:
                raise RuntimeError("the sandbox pool is closed")
            while True:
                while self._idle:
                    sb = self._idle.popleft()
                    self._cond.notify_all()  # wake the filler
                    if sb.alive():
                        self.handed_out += 1
                        return sb
                    sb.close()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        sb = self._new()
        self.handed_out += 1
        return sb

    def idle(self) -> int:
        with self._cond:
            return len(self._idle)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Block until ``size`` sessions are ready (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._idle) < self.size and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop refilling and close every idle session (handed-out sessions belong to their callers)."""
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
            self._cond.notify_all()
        for sb in idle:
            sb.close()
        self._thread.join(timeout=60)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: dict[tuple, SandboxPool] = {}
_shared_lock = threading.Lock()


def shared_pool(backend: str = "auto", limits: SandboxLimits | None = None, size: int = 2) -> SandboxPool:
    """The process-wide pool for (backend, limits, size); created on first use, closed at exit."""
    key = (backend, limits or SandboxLimits(), size)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool._closed:
            pool = _shared[key] = SandboxPool(backend, limits, size)
        return pool


def close_shared_pools() -> None:
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for p in pools:
        p.close()


import atexit  # noqa: E402

atexit.register(close_shared_pools)
