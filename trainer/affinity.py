"""CPU pinning of the learner and the rollout process (``trainer.pin_cpus``).

With ``trainer.backend=process`` the learner and the rollout run in two processes that share the
machine's cores. On a small machine the scheduler moves their threads around: the rollout
process's engine, event loop and tree writer threads take turns on the learner's core, and the
learner's step is preempted halfway. Pinning gives each side its own cores: the learner gets
``learner_threads`` of the CPUs this process may use (the first ones) and the rollout process the
rest, so the two only meet through the pipe (its effect on math-tiny: docs/measurements.md).

The price: a pinned process cannot borrow the other side's cores when that side idles (a learner
waiting for a slow env's batch leaves its core unused), which is why it is an option.

Linux only (``os.sched_setaffinity``); elsewhere :func:`split` returns ``None`` and nothing is pinned.
Pinning applies to every thread a process has when it is pinned; threads and processes it starts
afterwards inherit the mask of the thread that starts them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask), sorted; ``[]`` where that is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def cores_given() -> int:
    """How many CPUs this process may use: its affinity mask (``taskset``, a container's cpuset),
    not the machine's count. Work sized by the machine's count oversubscribes a process that was
    given fewer cores: spinning torch threads on 2 cores made a warm start ~20x slower."""
    return len(usable_cpus()) or os.cpu_count() or 1


def split(learner_cpus: int) -> tuple[list[int], list[int]] | None:
    """``(learner, rollout)`` CPU lists: the first ``learner_cpus`` usable CPUs and the rest, or
    ``None`` when there are not enough CPUs to leave the rollout at least one (or no affinity API)."""
    cpus = usable_cpus()
    if learner_cpus < 1 or len(cpus) <= learner_cpus or not hasattr(os, "sched_setaffinity"):
        return None
    return cpus[:learner_cpus], cpus[learner_cpus:]


def pin_process(cpus: list[int]) -> None:
    """Pin every thread of this process to ``cpus`` (a thread that ended meanwhile is skipped).

    A thread started while the threads are being pinned, by one not pinned yet, inherits the old
    mask and was not listed: so the list is read again until it holds no thread left unpinned."""
    done: set[int] = set()
    for _ in range(100):  # a process that never stops starting threads is pinned as far as it got
        try:
            tids = {int(t) for t in os.listdir("/proc/self/task")}
        except OSError:
            tids = {0}
        todo = tids - done
        if not todo:
            return
        for tid in sorted(todo):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
        done |= todo


@contextlib.contextmanager
def pinned(cpus: list[int] | None) -> Iterator[None]:
    """Pin this process's threads to ``cpus`` for the block, then give them back the mask they had
    (``None``: nothing is pinned)."""
    if not cpus:
        yield
        return
    before = usable_cpus()
    pin_process(cpus)
    try:
        yield
    finally:
        pin_process(before)
