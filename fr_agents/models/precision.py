"""Whether bfloat16 pays on this device: the one home of the ``auto`` precision settings.

bfloat16 halves what a decode step reads and, on hardware with bfloat16 instructions, runs the
matrix products about twice as fast as float32. Without such instructions the products are
emulated, and that is ruinous: on an AVX2-only CPU (AMD EPYC Milan, no AVX512) a bfloat16
``576 x 1536`` product ran at 1.2 GFLOP/s against float32's 84 (one thread, torch 2.13.0 CPU;
docs/measurements.md), so a recipe that names bfloat16 runs ~70x slower there than in float32.

So the presets say ``rollout.dtype: auto`` and ``trainer.autocast: auto``, and this module decides,
from what the hardware declares (never from a timing, so that every process of a run, the rollout
process included, decides the same):

* ``cuda``: bfloat16 when :func:`torch.cuda.is_bf16_supported` says so;
* ``cpu`` on x86: bfloat16 when the CPU has AVX512-BF16 or AMX tiles (what oneDNN's bfloat16
  kernels run on);
* ``cpu`` elsewhere: bfloat16 when ``/proc/cpuinfo`` lists the ``bf16`` feature (Arm).

>>> resolve_dtype("float32", "cpu", model_dtype="float32")
('float32', '')
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

AUTO = "auto"


@functools.cache
def bfloat16_support(device: str) -> tuple[bool, str]:
    """``(fast, why)``: whether ``device`` (``cpu`` or ``cuda``) runs bfloat16 products natively,
    and the reason in words for logs and the dry run."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible"
        ok = torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name()
        return ok, f"{name} {'supports' if ok else 'does not support'} bfloat16"
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        flags = []
        for flag, check in (("AVX512-BF16", "_is_avx512_bf16_supported"), ("AMX", "_is_amx_tile_supported")):
            probe = getattr(torch.cpu, check, None)
            if probe is not None and probe():
                flags.append(flag)
        if flags:
            return True, f"this CPU has {' and '.join(flags)} (bfloat16 products in hardware)"
        capability = torch.backends.cpu.get_cpu_capability()
        return False, (
            f"this CPU ({capability}) has neither AVX512-BF16 nor AMX: bfloat16 products are emulated "
            "(~70x slower than float32's on an AVX2 EPYC, docs/measurements.md)"
        )
    features = _cpuinfo_features()
    if "bf16" in features:
        return True, f"this {machine} CPU lists the bf16 feature"
    return False, f"this {machine} CPU does not list the bf16 feature: bfloat16 products would be emulated"


def _cpuinfo_features() -> set[str]:
    """The feature words of ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm); empty
    where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    words: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    return words


def resolve_dtype(value: str, device: str, *, model_dtype: str) -> tuple[str, str]:
    """``rollout.dtype``: ``(dtype, note)``. ``auto`` becomes ``bfloat16`` where it runs in hardware
    on ``device``, else ``model_dtype``; empty is ``model_dtype``; any other value stays. ``note``
    says why for ``auto`` (empty otherwise)."""
    if value != AUTO:
        return value or model_dtype, ""
    fast, why = bfloat16_support(device)
    return ("bfloat16" if fast else model_dtype), why


def resolve_autocast(value: str, device: str) -> tuple[str, str]:
    """``trainer.autocast``: ``(autocast, note)``. ``auto`` becomes ``bfloat16`` where it runs in
    hardware on ``device``, else ``""`` (off); other values stay."""
    if value != AUTO:
        return value, ""
    fast, why = bfloat16_support(device)
    return ("bfloat16" if fast else ""), why
