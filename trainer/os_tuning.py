"""How a training process sits on the machine: torch threads, CPU pinning, malloc and the garbage
collector. None of it changes what a run computes, only how fast it runs.

One name per switch: each config key is applied by the function of the same name::

    trainer.threads            learner_threads(cfg)     (rollout_threads, warm_start_threads: the others)
    trainer.pin_cpus           cpu_split(cfg)           (why_not_pinned: why it pins nothing; the
                                                         mechanism, trainer.os_tuning.pinned, pins)
    trainer.keep_freed_memory  keep_freed_memory(cfg)   once per process, by each side's builder
    trainer.freeze_gc          freeze_gc(cfg)           around a block of RL
    trainer.onednn_cache_capacity  onednn_cache_capacity(cfg)  before the first product, by each
                                                               side's builder

``keep_freed_memory`` and ``freeze_gc`` called without a config apply the setting unconditionally
(what the tests and the benchmarks measure).

Keeping freed memory. A training step on CPU allocates and frees the same tensors every time:
activations, gradients, a decode step's key/value rows. glibc's malloc serves a block over its mmap
threshold (128 KiB at start, raised as such blocks are freed) with a fresh ``mmap`` and returns it
to the kernel on ``free``, and trims the top of its heap once enough is free there. Either way the
next step's tensor lands on pages the kernel must fault in and zero again: on math-tiny, thousands
of page faults per learner step and per rollout batch, a few percent of the step in system time.

:func:`keep_freed_memory` raises both limits for the process (``mallopt``): blocks up to
``mmap_threshold`` come from the heap and go back to it, and the heap is trimmed only once more
than ``trim_threshold`` lies free at its top, so a step reuses the pages the last one freed.
Blocks larger than ``mmap_threshold`` (a large model's weights while loading) are still mapped and
returned to the kernel one by one. The price: the process keeps up to ``trim_threshold`` of freed
heap resident. glibc only (Linux); elsewhere nothing changes and :func:`keep_freed_memory` says why.

The garbage collector. Python's cyclic collector runs a young-generation pass every 700 net
allocations and, every so often, a full pass over every tracked object: in a training process that
is the model, transformers, torch and the rest, hundreds of thousands of objects that live all run.
A rollout makes many short-lived objects per episode (futures, dicts, lists), so those passes come
often, and on math-tiny's rollout they take several percent of a batch, most of it the full
passes. :func:`freeze_gc` collects once, then freezes every object that exists (``gc.freeze``:
the collector skips them from then on; reference counting still frees them) and runs the young
pass every ``young`` allocations, which leaves the collector almost nothing to do. Cycles made during
RL are still collected; cycles among the frozen objects would be kept until the block ends (the
collect before the freeze leaves none).

CPU pinning of the learner and the rollout process (``trainer.pin_cpus``).

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
import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Iterator

from fr_agents.config import TrainConfig

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
YOUNG_THRESHOLD = 10_000  # allocations between young-generation passes (Python's default: 700)


# =========================================================================== torch threads


def warm_start_threads() -> int:
    """Torch threads of the warm start: the cores this process is given (:func:`cores_given`), or
    ``OMP_NUM_THREADS`` when the user set it (the thread count decides nothing but speed: the warm
    start's recipe is chosen to land at the same held-out score on any thread count)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return cores_given()


@contextlib.contextmanager
def warm_start_cores() -> Iterator[None]:
    """Run a block (the warm start: supervised steps with nothing beside them in the process) on
    :func:`warm_start_threads` torch threads, then restore the count (``trainer.threads`` sizes the
    learner for RL, where the rollout side shares the cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(warm_start_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def learner_threads(cfg: TrainConfig) -> int:
    """Torch threads of the learner and its held-out evaluations: ``trainer.threads``, or half the
    cores this process is given."""
    return cfg.trainer.threads or max(1, cores_given() // 2)


def rollout_threads(cfg: TrainConfig) -> int:
    """Torch threads of a rollout process (``trainer.backend=process``): the cores the learner
    leaves, at least one; with ``trainer.pin_cpus``, one per CPU the process is pinned to."""
    cpus = cpu_split(cfg)
    if cpus is not None:
        return len(cpus[1])
    return max(1, cores_given() - learner_threads(cfg))


# =========================================================================== CPU pinning


def cpu_split(cfg: TrainConfig) -> tuple[list[int], list[int]] | None:
    """``trainer.pin_cpus``: the learner's CPUs (``learner_threads`` of them) and the rollout
    process's (the rest), or ``None`` when nothing is pinned (see :func:`why_not_pinned`)."""
    if not cfg.trainer.pin_cpus or cfg.trainer.backend != "process":
        return None
    return split(learner_threads(cfg))


def why_not_pinned(cfg: TrainConfig) -> str | None:
    """Why ``trainer.pin_cpus`` pins nothing in this run (``None``: it pins, or it is off)."""
    if not cfg.trainer.pin_cpus or cpu_split(cfg) is not None:
        return None
    if cfg.trainer.backend != "process":
        return (
            f"trainer.backend={cfg.trainer.backend} has no rollout process of its own to pin apart "
            "(pinning acts with trainer.backend=process)"
        )
    return f"no CPU is left for the rollout beside the learner's {learner_threads(cfg)}"


# =========================================================================== malloc


def onednn_cache_capacity(cfg: TrainConfig) -> str | None:
    """``trainer.onednn_cache_capacity``: cap oneDNN's primitive cache in this process (and the
    processes it starts afterwards, which inherit the environment), unless the environment already
    sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``. oneDNN reads it when it creates its first primitive, so
    this must run before the process's first bfloat16 product. Returns the capacity in force, or
    None when the key is 0 (oneDNN's default)."""
    n = cfg.trainer.onednn_cache_capacity
    if n <= 0:
        return os.environ.get(ONEDNN_CACHE_ENV)
    return os.environ.setdefault(ONEDNN_CACHE_ENV, str(n))


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def keep_freed_memory(
    cfg: TrainConfig | None = None,
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    trim_threshold: int = TRIM_THRESHOLD,
) -> str | None:
    """``trainer.keep_freed_memory``: make this process's malloc keep freed blocks up to
    ``mmap_threshold`` bytes and trim its heap only past ``trim_threshold`` free bytes.

    With ``cfg``: nothing when its key is off; when the setting cannot be applied, a warning says
    why (each side's builder calls it, in whichever process that side runs). Without: applied.
    Returns ``None`` when applied (or off), else why not."""
    if cfg is not None and not cfg.trainer.keep_freed_memory:
        return None
    why = _mallopt(mmap_threshold, trim_threshold)
    if why and cfg is not None:
        log.warning("trainer.keep_freed_memory: nothing changed: %s", why)
    return why


def _mallopt(mmap_threshold: int, trim_threshold: int) -> str | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "no glibc mallopt on this platform"
    gnu = getattr(libc, "gnu_get_libc_version", None)
    if gnu is None:
        return "the C library is not glibc"
    if not mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) or not mallopt(
        _M_TRIM_THRESHOLD, int(trim_threshold)
    ):
        return "glibc refused the thresholds"
    log.debug("malloc keeps freed blocks up to %d bytes, trims past %d", mmap_threshold, trim_threshold)
    return None


def release_freed_memory() -> bool:
    """Hand every arena's free memory back to the kernel (glibc's ``malloc_trim(0)``); False where
    there is no glibc. Called after the warm start: its batches of whole multi-turn episodes free
    gigabytes that :func:`keep_freed_memory` would otherwise keep resident beside the held-out
    evaluation and RL, whose allocations are of other sizes (an ALFWorld warm start of SmolLM2 left
    18 GB resident)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


# =========================================================================== the garbage collector


def freeze_gc(
    cfg: TrainConfig | None = None, *, young: int = YOUNG_THRESHOLD
) -> contextlib.AbstractContextManager[None]:
    """``trainer.freeze_gc``, for a block of RL: collect, freeze every object that exists now, run
    the young-generation pass every ``young`` allocations; afterwards the objects are unfrozen and
    the thresholds restored. With ``cfg`` whose key is off: nothing."""
    if cfg is not None and not cfg.trainer.freeze_gc:
        return contextlib.nullcontext()
    return _frozen_gc(young)


@contextlib.contextmanager
def _frozen_gc(young: int) -> Iterator[None]:
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


# =========================================================================== affinity


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
