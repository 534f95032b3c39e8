"""``trainer.keep_freed_memory``: a process that frees and re-allocates the same tensors every step
reuses its pages instead of faulting in fresh ones, and the key decides whether that is done.

Each case runs in a fresh interpreter (malloc's thresholds are process-wide and cannot be undone)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

STEPS = textwrap.dedent(
    """
    import resource, sys, torch
    from fr_agents.config import load_config
    from trainer.os_tuning import keep_freed_memory
    keep_freed_memory(load_config("math-tiny", sys.argv[1:]))
    def step():  # a step's tensors: 8 x 4 MiB, written, then all freed
        held = [torch.ones(1 << 20) for _ in range(8)]
        return sum(float(t[0]) for t in held)
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(*overrides: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, *overrides], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_keeping_freed_memory_stops_the_page_faults_of_repeated_steps():
    kept = _faults("trainer.keep_freed_memory=true")
    returned = _faults("trainer.keep_freed_memory=false")
    pages = 20 * 8 * (4 << 20) // 4096  # what 20 steps would fault if every tensor were fresh
    # reused: in 20 steps, less than one step's pages (8 x 4 MiB) fault again; measured 1,024 or 4,096
    # pages from run to run of the same code (the heap's layout), 163,182 without keeping
    assert kept < pages // 20
    # without it glibc hands the freed heap top back and faults it in again (how much depends on
    # the heap's layout; measured here: ~163,000 of the 163,840 pages)
    assert returned > 4 * kept


def test_keep_freed_memory_reports_why_it_did_nothing(monkeypatch):
    import ctypes

    from trainer import os_tuning

    class NoMallopt:  # a fake C library without mallopt (not glibc)
        def __init__(self, *a, **kw):
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert os_tuning.keep_freed_memory() == "no glibc mallopt on this platform"


def test_frozen_gc_skips_the_objects_made_before_and_restores_the_collector_after():
    import gc

    from trainer.os_tuning import freeze_gc

    before = gc.get_threshold()
    old = [[i] for i in range(1000)]  # objects that exist when RL starts
    with freeze_gc(young=5000):
        assert gc.get_freeze_count() >= len(old)
        assert gc.get_threshold() == (5000, *before[1:])
        cycle = []
        cycle.append(cycle)  # garbage made during RL is still collected
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


@pytest.mark.parametrize("on", [True, False])
def test_the_freeze_gc_key_decides(on):
    from fr_agents.config import load_config
    from trainer.os_tuning import freeze_gc

    cfg = load_config("math-tiny", [f"trainer.freeze_gc={str(on).lower()}"])
    import gc

    with freeze_gc(cfg):
        assert (gc.get_freeze_count() > 0) == on
    assert gc.get_freeze_count() == 0


RELEASE = textwrap.dedent(
    """
    import torch
    from trainer.os_tuning import keep_freed_memory, release_freed_memory
    assert keep_freed_memory() is None
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
    # 300 heap blocks of ~4 MiB; every other one is freed (~600 MiB), between blocks still in use,
    # so the freed ones cannot merge into the heap's top, where malloc's own trim returns memory
    held = [torch.ones((1 << 20) + 4096 * i) for i in range(300)]
    alive = held[1::2]
    del held
    kept = rss()
    print(release_freed_memory(), kept, rss())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_release_freed_memory_hands_kept_blocks_back():
    """What keep_freed_memory kept after a burst of large blocks (a warm start's), freed between
    blocks still in use, goes back to the kernel when released."""
    out = subprocess.run(
        [sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True"
    kept, released = int(out[1]), int(out[2])
    assert kept > 1000 and released < kept - 400, (kept, released)


def test_onednn_cache_capacity_caps_the_cache_unless_the_environment_sets_it(monkeypatch) -> None:
    """trainer.onednn_cache_capacity sets ONEDNN_PRIMITIVE_CACHE_CAPACITY for the process and the
    ones it starts; a value the environment already holds is kept; 0 leaves oneDNN's default."""
    from fr_agents.config import load_config
    from trainer.os_tuning import ONEDNN_CACHE_ENV, onednn_cache_capacity

    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    assert onednn_cache_capacity(load_config("math-tiny", ["trainer.onednn_cache_capacity=0"])) is None
    assert ONEDNN_CACHE_ENV not in os.environ
    assert onednn_cache_capacity(load_config("math-tiny", [])) == "16" == os.environ[ONEDNN_CACHE_ENV]
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ['{ONEDNN_CACHE_ENV}'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert child == "16"
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "4")
    assert onednn_cache_capacity(load_config("math-tiny", [])) == "4"
