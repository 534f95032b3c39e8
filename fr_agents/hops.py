"""Thread hops for the rollout's event loop, with results handed back in batches.

An episode's coroutine hands its blocking calls (env reset and step, tree writes) to threads and
awaits them. asyncio's own way (``loop.run_in_executor`` with a ``ThreadPoolExecutor``, or
``asyncio.wrap_future``) builds a ``concurrent.futures.Future`` with its own lock and condition
per call, chains it to an asyncio future with callbacks both ways, and wakes the event loop
(a write to its self-pipe) once per result. On math-tiny's rollout, 64 short episodes at a time,
that costs ~75 us of CPU per hop, several hops per episode, in the process that bounds the loop.

Here a thread that finishes a call puts ``(future, outcome)`` in the loop's :class:`Inbox`; the
first result of a burst schedules one drain on the loop, and the drain resolves every result
that has arrived by then. :class:`HopPool` is a thread pool that hands its results back this way.

* Order and outcome are unchanged: each call's result or exception reaches its own awaiter.
* An awaiter that was cancelled gets nothing; the call itself still runs to its end (as with
  ``run_in_executor``).
* A result for a loop that is already closed is dropped: nobody can await it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import weakref
from collections.abc import Callable
from typing import Any

Outcome = tuple[bool, Any]  # (True, result) or (False, exception)


class Inbox:
    """Results from other threads for one event loop, delivered in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[asyncio.Future, Outcome]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, fut: asyncio.Future, outcome: Outcome) -> None:
        """Hand ``outcome`` to ``fut`` (from any thread); the loop resolves it on its next drain."""
        with self._lock:
            self._items.append((fut, outcome))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        for fut, (ok, value) in items:
            if fut.done():  # cancelled by its awaiter
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)


_INBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Inbox] = weakref.WeakKeyDictionary()
_INBOXES_LOCK = threading.Lock()


def inbox() -> Inbox:
    """The running loop's inbox (one per loop, made on first use)."""
    loop = asyncio.get_running_loop()
    found = _INBOXES.get(loop)
    if found is None:
        with _INBOXES_LOCK:
            found = _INBOXES.setdefault(loop, Inbox(loop))
    return found


def awaiter() -> tuple[asyncio.Future, Callable[[Outcome], None]]:
    """A future on the running loop and the ``tell(outcome)`` that resolves it through the loop's
    inbox (callable from any thread)."""
    box = inbox()
    fut = box.loop.create_future()
    return fut, lambda outcome: box.put(fut, outcome)


def teller(fut: concurrent.futures.Future) -> Callable[[Outcome], None]:
    """``tell(outcome)`` for a caller that is a thread and holds ``fut``: sets it, unless the caller
    cancelled it first (then the outcome is dropped; setting it would raise in the worker)."""

    def tell(outcome: Outcome) -> None:
        if fut.set_running_or_notify_cancel():
            ok, value = outcome
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    return tell


def run(fn: Callable[[], Any]) -> Outcome:
    """Call ``fn()`` and return its outcome; BaseException included, so that it reaches the awaiter."""
    try:
        return True, fn()
    except BaseException as e:  # noqa: BLE001 - handed to the awaiter
        return False, e


class HopPool:
    """A pool of up to ``max_workers`` daemon threads whose results come back through the inbox.

    ``await pool.call(fn, *args)`` runs ``fn(*args)`` on a pool thread. A thread is started when a
    call finds none idle (calls that block, such as a sandbox's step, each hold one), and stays.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.name = name
        self._queue: collections.deque[tuple[Callable[[], Any], Callable[[Outcome], None]]] = (
            collections.deque()
        )
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0
        self._threads = 0

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on a pool thread and return its result (or raise its exception)."""
        fut, tell = awaiter()
        with self._cond:
            self._queue.append(((lambda: fn(*args)) if args else fn, tell))
            if self._idle > 0:
                self._idle -= 1  # claimed: the next notify wakes exactly this work
                self._cond.notify()
            elif self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"{self.name}_{self._threads - 1}", daemon=True
                ).start()
        return await fut

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._idle += 1
                    self._cond.wait()
                job, tell = self._queue.popleft()
            tell(run(job))
