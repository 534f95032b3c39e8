"""Who owns a sandbox: labels that let a reaper tell live owners from dead ones.

A sandbox is labelled with its owner's host name, pid and process start time (the start time guards
against pid reuse). Docker containers carry it as labels; bubblewrap processes and cgroups carry it
in the sandbox host name / directory name ``frsbx-<pid>-<starttime>-<n>``.
"""

from __future__ import annotations

import itertools
import os
import socket

LABEL = "fr_agents.sandbox"
OWNER_LABEL = "fr_agents.owner"
BWRAP_PREFIX = "frsbx-"

_counter = itertools.count(1)
_owner_cache: dict[int, str] = {}


def _stat_after_name(pid: int) -> list[str] | None:
    """Fields 3 on of ``/proc/<pid>/stat`` (None when no such process exists). The command name (field
    2) may hold spaces and parentheses, so the split is after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def proc_start_time(pid: int) -> str | None:
    """The start time (clock ticks since boot) of ``pid``, or None when no such process exists."""
    rest = _stat_after_name(pid)
    return rest[19] if rest is not None and len(rest) > 19 else None  # field 22


def proc_parent(pid: int) -> int | None:
    """The parent pid of ``pid``, or None when no such process exists."""
    rest = _stat_after_name(pid)
    return int(rest[1]) if rest is not None and len(rest) > 1 else None  # field 4


def owner_id() -> str:
    """``host:pid:starttime`` of this process (recomputed after a fork)."""
    pid = os.getpid()
    if pid not in _owner_cache:
        _owner_cache[pid] = f"{socket.gethostname()}:{pid}:{proc_start_time(pid)}"
    return _owner_cache[pid]


def owner_alive(owner: str) -> bool:
    """Whether the process named by ``owner`` still runs. Owners on other hosts count as alive."""
    try:
        host, pid, start = owner.rsplit(":", 2)
        pid_i = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    return proc_start_time(pid_i) == start


def new_bwrap_label() -> str:
    """A fresh ``frsbx-<pid>-<start>-<n>`` (a valid host name, at most 64 characters)."""
    pid = os.getpid()
    return f"{BWRAP_PREFIX}{pid}-{proc_start_time(pid)}-{next(_counter)}"


def parse_bwrap_label(label: str) -> tuple[int, str] | None:
    """``(owner pid, owner start time)`` of a bwrap label, or None when it is not one."""
    if not label.startswith(BWRAP_PREFIX):
        return None
    parts = label[len(BWRAP_PREFIX) :].split("-")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1]
