"""The tree-writer thread: every write an episode makes to the trajectory store, off the event loop.

Episodes are coroutines on one event loop; the store is SQLite, whose writes block. So the rollout
hands each write to one thread, :data:`TREE_WRITER`, and awaits it::

    node = await tree_write(tree.append, node, ids, logprobs, True, version)
    leaf = await tree_write_durable(tree.finish, node, reward, ...)   # on disk before it returns

One thread keeps each episode's writes in the order they were made. It takes every write queued at
that moment and commits a run of writes to the same tree as one transaction (group commit, see
:class:`TreeWriter`), so episodes finishing together share one commit and one fsync.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from fr_agents import hops

log = logging.getLogger(__name__)

_Write = tuple[Any, Callable[[], Any], Callable[[hops.Outcome], None], bool]  # (tree, write, tell, durable)


class TreeWriter:
    """The tree's writer thread, with group commit.

    Tree writes (SQLite) run on one thread so that they never stall the event loop, and in the
    order they were queued, so each episode's writes stay in order. The thread takes every write
    queued at that moment (up to ``max_group``) and runs a run of writes to the same tree inside
    one transaction (``TrajectoryTree.group``): each write is its own savepoint (a write that
    raises is undone alone and its caller gets the error), and the run commits once. Callers
    are told after that commit, so a write is in the database when its caller resumes. One commit
    per write would write pages to the WAL three times per episode.

    A write submitted ``durable=True`` (a finished trajectory) resolves only after the run it
    committed with is also fsynced (``tree.sync()``): one fsync per run, however many durable
    writes it holds, and no second thread hop per episode to ask for it.
    """

    def __init__(self, max_group: int = 256) -> None:
        self.max_group = max_group
        self._queue: queue.SimpleQueue[_Write] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def put(
        self, tree: Any, fn: Callable[[], Any], tell: Callable[[hops.Outcome], None], *, durable: bool = False
    ) -> None:
        """Queue ``fn()`` (a write to ``tree``); ``tell(outcome)`` runs on the writer thread once the
        write is committed (``durable``: and fsynced)."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fr-tree", daemon=True)
                self._thread.start()
        self._queue.put((tree, fn, tell, durable))

    def submit(self, tree: Any, fn: Callable[[], Any], *, durable: bool = False) -> concurrent.futures.Future:
        """:meth:`put` for threads: the returned future resolves once the write is committed."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.put(tree, fn, hops.teller(fut), durable=durable)
        return fut

    async def write(self, tree: Any, fn: Callable[[], Any], *, durable: bool = False) -> Any:
        """:meth:`put` for the event loop: the result of ``fn()`` once it is committed."""
        fut, tell = hops.awaiter()
        self.put(tree, fn, tell, durable=durable)
        return await fut

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self.max_group:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            start = 0
            while start < len(items):  # runs of consecutive writes to the same tree
                end = start + 1
                while end < len(items) and items[end][0] is items[start][0]:
                    end += 1
                self._commit(items[start:end])
                start = end

    @staticmethod
    def _commit(run: list[_Write]) -> None:
        tree = run[0][0]
        group = getattr(tree, "group", None)
        outcomes: list[hops.Outcome] = []
        try:
            with group() if callable(group) else contextlib.nullcontext():
                for _, fn, _, _ in run:
                    outcomes.append(hops.run(fn))  # this write's own error goes to its caller
        except BaseException as e:  # noqa: BLE001 - the commit failed: none of the run is stored
            outcomes = [(False, e)] * len(run)
        else:
            sync = getattr(tree, "sync", None)
            if callable(sync) and any(w[3] for w in run):
                failed = hops.run(sync)
                if not failed[0]:  # not durable: the durable writes fail with it
                    outcomes = [failed if w[3] else o for w, o in zip(run, outcomes, strict=True)]
        for (_, _, tell, _), outcome in zip(run, outcomes, strict=True):
            try:
                tell(outcome)
            except Exception:  # noqa: BLE001 - one caller's failure must not stop the writer or the others
                log.exception("tree writer: handing a caller its outcome failed")


TREE_WRITER = TreeWriter()
"""The rollout's one tree writer (its thread starts with the first write)."""


async def tree_write(fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """Run the tree write ``fn(*a, **kw)`` (a bound method of the tree) on the tree's writer thread."""
    return await TREE_WRITER.write(getattr(fn, "__self__", None), lambda: fn(*a, **kw))


async def tree_write_durable(fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """As :func:`tree_write`, returning only once the write is also on disk (the writer's group fsync)."""
    return await TREE_WRITER.write(getattr(fn, "__self__", None), lambda: fn(*a, **kw), durable=True)
