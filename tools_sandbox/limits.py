"""Resource limits of one sandbox session, shared by every backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """What one session may use. Every field is enforced by both backends (see each backend for how).

    ``memory_mb``    memory of the whole session, swap included (cgroup; ``RLIMIT_AS`` as a fallback)
    ``cpus``         CPU quota in cores (cgroup CPU quota where available)
    ``pids``         processes + threads of the session (cgroup pids; ``RLIMIT_NPROC`` as a fallback)
    ``nofile``       open file descriptors per process (``RLIMIT_NOFILE``)
    ``tmpfs_mb``     size of the writable work directory ``/work`` (and of ``/tmp``)
    ``output_bytes`` bytes kept of stdout and of stderr per call; the rest is counted and marked
    ``call_timeout`` default hard deadline of one call, in seconds
    ``start_timeout`` seconds a worker may take to start before the start counts as failed
    """

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 64
    nofile: int = 256
    tmpfs_mb: int = 64
    output_bytes: int = 64 * 1024
    call_timeout: float = 10.0
    start_timeout: float = 30.0

    def __post_init__(self) -> None:
        minimum = {"memory_mb": 32, "pids": 8, "nofile": 32, "tmpfs_mb": 1, "output_bytes": 256}
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"SandboxLimits.{name} must be an int >= {low}, got {value!r}")
        for name in ("cpus", "call_timeout", "start_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)
