"""The reaper: remove sandboxes whose owner process is gone (or, on request, all of ours).

A process that dies hard (SIGKILL, OOM, a power cut of the trainer) cannot run its clean-up, so its
containers, bwrap namespaces and cgroups would live on. Every sandbox is labelled with its owner
(:mod:`tools_sandbox.owner`); the reaper removes those whose owner no longer runs. It runs

* at start-up: the first sandbox of each backend a process opens reaps dead owners' leftovers;
* at exit: a process sweeps whatever of its own is left (after the per-session finalizers);
* on demand: ``fr-agents sandbox gc`` (``--all`` removes live owners' sandboxes too).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from pathlib import Path

from tools_sandbox.cgroups import SessionCgroup, stale_cgroup_dirs
from tools_sandbox.owner import (
    BWRAP_PREFIX,
    LABEL,
    OWNER_LABEL,
    owner_alive,
    owner_id,
    parse_bwrap_label,
    proc_start_time,
)

log = logging.getLogger(__name__)


def _selected(alive: bool, is_own: bool, all_owners: bool, only_own: bool) -> bool:
    if only_own:
        return is_own
    return all_owners or not alive


def reap_docker(*, all_owners: bool = False, only_own: bool = False) -> list[str]:
    """Remove labelled containers of dead owners (or all / only this process's). Returns their ids."""
    try:
        from tools_sandbox.docker_backend import docker_client

        api = docker_client().api
        containers = api.containers(all=True, filters={"label": LABEL})
    except Exception as e:  # noqa: BLE001 - no daemon: nothing to reap
        log.debug("docker reaper skipped: %s", e)
        return []
    me = owner_id()
    removed = []
    for c in containers:
        owner = (c.get("Labels") or {}).get(OWNER_LABEL, "")
        if _selected(owner_alive(owner), owner == me, all_owners, only_own):
            try:
                api.remove_container(c["Id"], force=True)
                removed.append(c["Id"])
            except Exception as e:  # noqa: BLE001
                log.warning("could not remove container %s: %s", c["Id"][:12], e)
    if removed:
        log.info("reaped %d sandbox container(s)", len(removed))
    return removed


def _bwrap_processes() -> list[tuple[int, str]]:
    """(pid, label) of every bwrap process carrying a sandbox label."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != b"bwrap":
            continue
        for i, a in enumerate(argv[:-1]):
            if a == b"--hostname" and argv[i + 1].startswith(BWRAP_PREFIX.encode()):
                out.append((int(entry), argv[i + 1].decode()))
                break
    return out


def _label_state(label: str) -> tuple[bool, bool]:
    """(owner alive, owner is this process) for a bwrap label."""
    parsed = parse_bwrap_label(label)
    if parsed is None:
        return True, False
    pid, start = parsed
    alive = proc_start_time(pid) == start
    return alive, alive and pid == os.getpid()


def reap_bwrap(*, all_owners: bool = False, only_own: bool = False) -> list[str]:
    """Kill labelled bwrap sandboxes and remove their cgroups; returns what was removed."""
    removed = []
    for pid, label in _bwrap_processes():
        alive, own = _label_state(label)
        if _selected(alive, own, all_owners, only_own):
            try:
                os.kill(pid, signal.SIGKILL)
                removed.append(f"pid {pid} ({label})")
            except OSError:
                pass
    for d in stale_cgroup_dirs(BWRAP_PREFIX):
        alive, own = _label_state(d.name)
        if _selected(alive, own, all_owners, only_own):
            cg = SessionCgroup({d.parent.name: d}, counters=None)  # type: ignore[arg-type]
            if cg.destroy(wait_s=1.0):
                removed.append(str(d))
    if removed:
        log.info("reaped %d bwrap leftover(s)", len(removed))
    return removed


def gc(*, all_owners: bool = False) -> dict[str, list[str]]:
    """Reap both backends; the CLI's ``fr-agents sandbox gc``."""
    return {"docker": reap_docker(all_owners=all_owners), "bwrap": reap_bwrap(all_owners=all_owners)}


def leftovers() -> dict[str, list[str]]:
    """What of *this process* still exists: container ids, bwrap processes, cgroup dirs."""
    me = owner_id()
    containers: list[str] = []
    try:
        from tools_sandbox.docker_backend import docker_client

        for c in docker_client().api.containers(all=True, filters={"label": f"{OWNER_LABEL}={me}"}):
            containers.append(c["Id"])
    except Exception:  # noqa: BLE001 - no daemon, no containers
        pass
    procs = [f"{pid} {label}" for pid, label in _bwrap_processes() if _label_state(label)[1]]
    cgroups = [str(d) for d in stale_cgroup_dirs(BWRAP_PREFIX) if _label_state(d.name)[1]]
    return {"containers": containers, "bwrap_processes": procs, "cgroups": cgroups}


_startup_done: set[str] = set()
_startup_lock = threading.Lock()


def reap_at_startup(backend: str) -> None:
    """Once per process and backend: remove dead owners' leftovers."""
    with _startup_lock:
        if backend in _startup_done:
            return
        _startup_done.add(backend)
    (reap_docker if backend == "docker" else reap_bwrap)()


def _sweep_own_at_exit() -> None:
    if "docker" in _startup_done:
        reap_docker(only_own=True)
    if "bwrap" in _startup_done:
        reap_bwrap(only_own=True)


atexit.register(_sweep_own_at_exit)
