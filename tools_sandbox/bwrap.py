"""The bubblewrap backend: a worker in fresh namespaces, no daemon needed.

Isolation, per session:

* every namespace unshared (user, pid, net, ipc, uts, cgroup): no network at all (only a private
  loopback), no view of host processes, uid 65534 inside;
* the file system is a fresh tmpfs root, read-only after set-up, with the host's ``/usr`` (and the
  ``/bin``, ``/lib``... links into it) bound read-only, a handful of harmless ``/etc`` files, a
  synthetic ``/etc/passwd``, and size-limited tmpfs ``/work`` (the working directory) and ``/tmp``.
  Nothing else of the host (``/root``, ``/home``, ``/etc/shadow``, the project) is visible;
* the environment is cleared; ``--die-with-parent`` and ``--new-session``;
* limits: when this process can write cgroups (root, or a delegated v2 subtree) the session gets its
  own cgroup (memory incl. swap, pids, CPU quota) and the host reads its OOM / pids counters; the
  worker always sets rlimits (open files, file size, core dumps), plus address space and process
  count when no cgroup is available;
* when running as root, bubblewrap itself is started as uid 65534 (unprivileged user namespaces),
  so even an escape would land as ``nobody`` on the host.

Every bwrap process carries the label ``frsbx-<pid>-<start>-<n>`` (its ``--hostname``), which the
reaper uses to find sandboxes whose owner died.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import select
import shutil
import subprocess

from tools_sandbox.cgroups import SessionCgroup
from tools_sandbox.limits import SandboxLimits
from tools_sandbox.owner import new_bwrap_label
from tools_sandbox.session import SANDBOX_ENV, SANDBOX_UID, WORKER_SOURCE, Sandbox, SessionState, Transport

log = logging.getLogger(__name__)

_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf")
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
# Run as the launcher: move itself into the session cgroup(s), then become bwrap.
_CGROUP_LAUNCHER = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
)


def find_python() -> str | None:
    """A Python 3 under ``/usr`` (the sandbox sees only ``/usr``), or None."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    return None


def _drop_kwargs() -> dict:
    if os.geteuid() == 0:
        return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
    return {}


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in _ETC_FILES:
        p = f"/etc/{name}"
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    for p in sorted(glob.glob("/etc/python3*")):
        args += ["--ro-bind", p, p]
    return args


def build_argv(
    label: str, limits: SandboxLimits, python: str, worker_cfg: str, data_fds: dict[str, int]
) -> list[str]:
    """The full bwrap command line of one worker."""
    tmpfs_bytes = str(limits.tmpfs_mb << 20)
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        label,
        *_system_binds(),
    ]
    for dest, fd in data_fds.items():
        argv += ["--ro-bind-data", str(fd), dest]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        tmpfs_bytes,
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--size",
        tmpfs_bytes,
        "--perms",
        "1777",
        "--tmpfs",
        "/work",
        "--chdir",
        "/work",
        "--remount-ro",
        "/",
        "--clearenv",
    ]
    for k, v in SANDBOX_ENV.items():
        argv += ["--setenv", k, v]
    argv += [python, "-I", "-u", "-c", WORKER_SOURCE, worker_cfg]
    return argv


class PipeTransport(Transport):
    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.wfd = proc.stdin.fileno()
        self.rfd = proc.stdout.fileno()
        self.poller = select.poll()
        self.poller.register(self.rfd, select.POLLIN)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]

    def recv(self, wait_s: float) -> bytes | None:
        if not self.poller.poll(max(0, int(wait_s * 1000) + 1)):
            return None
        return os.read(self.rfd, 1 << 20)

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


class BwrapState(SessionState):
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.cgroup: SessionCgroup | None = None

    def kill_worker(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.kill()  # bwrap; --die-with-parent takes the namespace (and all in it) down
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("bwrap pid %s did not die: %s", proc.pid, e)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def release(self) -> None:
        if self.cgroup is not None and not self.cgroup.destroy(wait_s=2.0):
            log.warning("could not remove cgroup %s (the reaper will)", list(self.cgroup.dirs.values()))
        self.cgroup = None


class BwrapSandbox(Sandbox):
    """A session in bubblewrap namespaces. See the module docstring for what is isolated and how."""

    backend = "bwrap"

    def __init__(
        self, limits: SandboxLimits | None = None, python: str | None = None, use_cgroups: bool = True
    ) -> None:
        state = BwrapState()
        super().__init__(limits, state)
        self._st = state
        self.python = python or find_python()
        if self.python is None:
            raise RuntimeError(
                "no /usr/bin/python3 on this host for the bwrap sandbox (apt-get install python3)"
            )
        self.label = new_bwrap_label()
        self.use_cgroups = use_cgroups
        self._cgroup_tried = False

    @property
    def cgroup(self) -> SessionCgroup | None:
        return self._st.cgroup

    def _ensure_cgroup(self) -> None:
        if self._cgroup_tried or not self.use_cgroups:
            return
        self._cgroup_tried = True
        lim = self.limits
        uid = SANDBOX_UID if os.geteuid() == 0 else None
        self._st.cgroup = SessionCgroup.create(self.label, lim.memory_mb, lim.pids, lim.cpus, uid)
        if self._st.cgroup is None:
            log.info("bwrap: no writable cgroup; limits fall back to rlimits (RLIMIT_AS, RLIMIT_NPROC)")

    def worker_config(self) -> dict:
        cfg = super().worker_config()
        if self._st.cgroup is None:
            cfg["rlimits"]["as"] = (self.limits.memory_mb + 64) << 20
            cfg["rlimits"]["nproc"] = self.limits.pids
        return cfg

    def _spawn(self) -> Transport:
        import json

        self._ensure_cgroup()
        cfg = json.dumps(self.worker_config())
        fds: dict[str, int] = {}
        to_close: list[int] = []
        try:
            for dest, text in (("/etc/passwd", _PASSWD), ("/etc/group", _GROUP)):
                r, w = os.pipe()
                os.write(w, text.encode())
                os.close(w)
                fds[dest] = r
                to_close.append(r)
            assert self.python is not None
            argv = build_argv(self.label, self.limits, self.python, cfg, fds)
            if self._st.cgroup is not None:
                files = self._st.cgroup.procs_files
                argv = [
                    "/bin/sh",
                    "-c",
                    _CGROUP_LAUNCHER,
                    "fr-sandbox-launch",
                    str(len(files)),
                    *files,
                    *argv,
                ]
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin"},
                pass_fds=tuple(fds.values()),
                start_new_session=True,
                cwd="/",
                **_drop_kwargs(),
            )
        finally:
            for fd in to_close:
                os.close(fd)
        self._st.proc = proc
        return PipeTransport(proc)

    def _start_failure(self) -> str:
        proc = self._st.proc
        if proc is None or proc.stderr is None:
            return ""
        try:
            if select.select([proc.stderr], [], [], 0.2)[0]:
                return os.read(proc.stderr.fileno(), 4096).decode(errors="replace").strip()
        except (OSError, ValueError):
            pass
        return ""

    def _counters(self) -> tuple[int, int]:
        cg = self._st.cgroup
        return cg.counters.read() if cg is not None else (0, 0)

    def _alive(self) -> bool:
        return self._transport is not None and self._st.proc is not None and self._st.proc.poll() is None

    def __repr__(self) -> str:
        return f"<BwrapSandbox {self.label} {'closed' if self.closed else 'open'}>"


@functools.lru_cache(maxsize=1)
def bwrap_available() -> tuple[bool, str]:
    """(usable, reason): bubblewrap is installed and can create the namespaces we need here."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap is not installed (apt-get install bubblewrap)"
    python = find_python()
    if python is None:
        return False, "no /usr/bin/python3 for the sandbox worker (apt-get install python3)"
    argv = [
        exe,
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        python,
        "-c",
        "pass",
    ]
    try:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=20,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            **_drop_kwargs(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap probe failed: {e}"
    if out.returncode != 0:
        return False, (
            f"bwrap cannot create namespaces here ({out.stderr.strip()}); enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1) or use Docker"
        )
    return True, exe
