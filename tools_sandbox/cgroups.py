"""Per-session cgroups for the bubblewrap backend (and counters for Docker containers).

bubblewrap itself sets no resource limits. When this process may write a cgroup hierarchy (root, or a
delegated cgroup v2 subtree) each session gets its own cgroup with memory (swap included), pids and
CPU limits; otherwise the worker falls back to rlimits (see :mod:`tools_sandbox.bwrap`).

Both v1 (one directory per controller) and v2 (one unified directory) are handled. The counters
``oom_kill`` and ``pids_max`` (how often the limits were hit) tell the host *why* a worker died.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller -> path of this process's cgroup (``""`` key for the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _is_v2() -> bool:
    return (_ROOT / "cgroup.controllers").exists()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


class CgroupCounters:
    """Reads how often a cgroup hit its memory / pids limit (missing files read as 0)."""

    def __init__(self, oom_file: Path | None, pids_file: Path | None, oom_key: str = "oom_kill") -> None:
        self.oom_file, self.pids_file, self.oom_key = oom_file, pids_file, oom_key

    def read(self) -> tuple[int, int]:
        oom = _read_counter(self.oom_file, self.oom_key) if self.oom_file else 0
        pids = _read_counter(self.pids_file, "max") if self.pids_file else 0
        return oom, pids

    @classmethod
    def for_docker(cls, container_id: str) -> CgroupCounters | None:
        """Counters of a Docker container's cgroup when it is visible from here (cgroupfs/systemd)."""
        if _is_v2():
            for base in (
                _ROOT / "system.slice" / f"docker-{container_id}.scope",
                _ROOT / "docker" / container_id,
            ):
                if base.exists():
                    return cls(base / "memory.events", base / "pids.events")
            return None
        for mem, pids in (
            (_ROOT / "memory/docker" / container_id, _ROOT / "pids/docker" / container_id),
            (
                _ROOT / f"memory/system.slice/docker-{container_id}.scope",
                _ROOT / f"pids/system.slice/docker-{container_id}.scope",
            ),
        ):
            if mem.exists() or pids.exists():
                return cls(
                    mem / "memory.oom_control" if mem.exists() else None,
                    pids / "pids.events" if pids.exists() else None,
                )
        return None


class SessionCgroup:
    """The cgroup(s) of one bwrap session. Use :meth:`create`; ``None`` means "not available here"."""

    def __init__(self, dirs: dict[str, Path], counters: CgroupCounters) -> None:
        self.dirs = dirs  # controller ("memory", "pids", "cpu", or "" for v2) -> directory
        self.counters = counters

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    @classmethod
    def create(
        cls, name: str, memory_mb: int, pids: int, cpus: float, owner_uid: int | None
    ) -> SessionCgroup | None:
        try:
            return (
                cls._create_v2(name, memory_mb, pids, cpus, owner_uid)
                if _is_v2()
                else cls._create_v1(name, memory_mb, pids, cpus, owner_uid)
            )
        except OSError as e:
            log.debug("no cgroup for %s: %s", name, e)
            return None

    @classmethod
    def _create_v1(
        cls, name: str, memory_mb: int, pids: int, cpus: float, owner_uid: int | None
    ) -> SessionCgroup | None:
        own = _own_paths()
        dirs: dict[str, Path] = {}
        try:
            for ctrl in ("memory", "pids", "cpu"):
                base = _ROOT / ctrl
                if not base.is_dir() or ctrl not in own:
                    if ctrl in ("memory", "pids"):
                        raise OSError(f"cgroup v1 controller {ctrl} is not mounted")
                    continue
                d = base / own[ctrl].lstrip("/") / name
                d.mkdir()
                dirs[ctrl] = d
            limit = str(memory_mb << 20)
            _write(dirs["memory"] / "memory.limit_in_bytes", limit)
            if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", limit)
            _write(dirs["pids"] / "pids.max", str(pids))
            if "cpu" in dirs:
                _write(dirs["cpu"] / "cpu.cfs_period_us", "100000")
                _write(dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpus * 100000)))
            cls._chown(dirs, owner_uid)
        except OSError:
            cls._remove_dirs(dirs)
            raise
        counters = CgroupCounters(dirs["memory"] / "memory.oom_control", dirs["pids"] / "pids.events")
        return cls(dirs, counters)

    @classmethod
    def _create_v2(
        cls, name: str, memory_mb: int, pids: int, cpus: float, owner_uid: int | None
    ) -> SessionCgroup | None:
        parent = _ROOT / _own_paths().get("", "/").lstrip("/")
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            raise OSError(f"memory and pids are not delegated below {parent}")
        d = parent / name
        d.mkdir()
        try:
            _write(d / "memory.max", str(memory_mb << 20))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids))
            if "cpu" in enabled:
                _write(d / "cpu.max", f"{int(cpus * 100000)} 100000")
            cls._chown({"": d}, owner_uid)
        except OSError:
            cls._remove_dirs({"": d})
            raise
        return cls({"": d}, CgroupCounters(d / "memory.events", d / "pids.events"))

    @staticmethod
    def _chown(dirs: dict[str, Path], uid: int | None) -> None:
        # The launcher moves itself into the cgroup after dropping to the sandbox user.
        if uid is None:
            return
        for d in dirs.values():
            os.chown(d / "cgroup.procs", uid, -1)

    @staticmethod
    def _remove_dirs(dirs: dict[str, Path], wait_s: float = 0.0) -> bool:
        ok = True
        for d in dirs.values():
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        ok = False
                        break
                    time.sleep(0.01)
        return ok

    def pids(self) -> set[int]:
        """The processes in the cgroup (any controller's), zombies not yet reaped included."""
        out: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return out

    def kill_all(self) -> None:
        """SIGKILL every process still in the cgroup."""
        for p in self.pids():
            with contextlib.suppress(OSError):
                os.kill(p, 9)

    def destroy(self, wait_s: float = 2.0) -> bool:
        self.kill_all()
        return self._remove_dirs(self.dirs, wait_s)


def stale_cgroup_dirs(prefix: str) -> list[Path]:
    """Session cgroup directories named ``prefix...`` next to this process's own cgroups."""
    own = _own_paths()
    bases = (
        [_ROOT / own.get("", "/").lstrip("/")]
        if _is_v2()
        else [_ROOT / c / own[c].lstrip("/") for c in ("memory", "pids", "cpu") if c in own]
    )
    out = []
    for base in bases:
        with contextlib.suppress(OSError):
            out.extend(p for p in base.iterdir() if p.is_dir() and p.name.startswith(prefix))
    return out
