"""Memory settings of the training processes: keeping freed CPU memory in the process
(``trainer.keep_freed_memory``) and a quiet garbage collector during RL (``trainer.freeze_gc``).

A training step on CPU allocates and frees the same tensors every time: activations, gradients,
a decode step's key/value rows. glibc's malloc serves a block over its mmap threshold (128 KiB at
start, raised as such blocks are freed) with a fresh ``mmap`` and returns it to the kernel on
``free``, and trims the top of its heap once enough is free there. Either way the next step's
tensor lands on pages the kernel must fault in and zero again: on math-tiny, thousands of page
faults per learner step and per rollout batch, a few percent of the step in system time.

:func:`keep_freed_memory` raises both limits for the process (``mallopt``): blocks up to
``mmap_threshold`` come from the heap and go back to it, and the heap is trimmed only once more
than ``trim_threshold`` lies free at its top, so a step reuses the pages the last one freed.
Blocks larger than ``mmap_threshold`` (a large model's weights while loading) are still mapped and
returned to the kernel one by one. The price: the process keeps up to ``trim_threshold`` of freed
heap resident.

glibc only (Linux); elsewhere nothing changes and :func:`keep_freed_memory` says why.

The garbage collector. Python's cyclic collector runs a young-generation pass every 700 net
allocations and, every so often, a full pass over every tracked object: in a training process that
is the model, transformers, torch and the rest, hundreds of thousands of objects that live all run.
A rollout makes many short-lived objects per episode (futures, dicts, lists), so those passes come
often, and on math-tiny's rollout they take several percent of a batch, most of it the full
passes. :func:`frozen_gc` collects once, then freezes every object that exists (``gc.freeze``:
the collector skips them from then on; reference counting still frees them) and runs the young
pass every ``young`` allocations, which leaves the collector almost nothing to do. Cycles made during
RL are still collected; cycles among the frozen objects would be kept until the block ends (the
collect before the freeze leaves none).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
YOUNG_THRESHOLD = 10_000  # allocations between young-generation passes (Python's default: 700)


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> str | None:
    """Make this process's malloc keep freed blocks up to ``mmap_threshold`` bytes and trim its heap
    only past ``trim_threshold`` free bytes. Returns ``None`` when applied, else why not."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "no glibc mallopt on this platform"
    gnu = getattr(libc, "gnu_get_libc_version", None)
    if gnu is None:
        return "the C library is not glibc"
    if not mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) or not mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)):
        return "glibc refused the thresholds"
    log.debug("malloc keeps freed blocks up to %d bytes, trims past %d", mmap_threshold, trim_threshold)
    return None


@contextlib.contextmanager
def frozen_gc(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """For the block: collect, freeze every object that exists now, run the young-generation pass
    every ``young`` allocations; afterwards the objects are unfrozen and the thresholds restored."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
