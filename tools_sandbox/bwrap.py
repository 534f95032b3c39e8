"""The bubblewrap backend: a worker in fresh namespaces, no daemon needed.

Isolation, per session:

* every namespace unshared (user, pid, net, ipc, uts, cgroup): no network at all (only a private
  loopback), no view of host processes, uid 65534 inside;
* the file system is a fresh tmpfs root, read-only after set-up, holding the ``/usr`` and ``/etc``
  (and the ``/bin``, ``/lib``... links into ``/usr``) of the **sandbox image's root file system**
  (the debootstrapped Debian that the Docker image is imported from, :mod:`tools_sandbox.image`;
  ``fr-agents sandbox build-image --rootfs-only`` builds it), a synthetic ``/etc/passwd``, and
  size-limited tmpfs ``/work`` (the working directory) and ``/tmp``. Nothing of the host's own file
  system is visible: not its ``/usr`` (its Python packages, e.g. a pristine copy of a library a
  repository task is about), ``/root``, ``/home``, ``/etc`` or the project. Both backends therefore
  run the same Python and packages;
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

import contextlib
import functools
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from tools_sandbox.cgroups import SessionCgroup
from tools_sandbox.limits import SandboxLimits
from tools_sandbox.owner import new_bwrap_label, proc_parent
from tools_sandbox.session import SANDBOX_ENV, SANDBOX_UID, WORKER_SOURCE, Sandbox, SessionState, Transport

log = logging.getLogger(__name__)

_NO_ROOTFS = (
    "the sandbox root file system is missing: build it with `fr-agents sandbox build-image --rootfs-only` "
    "(as root, needs debootstrap; the bwrap sandbox runs the image's Python, never the host's /usr)"
)

# The root file system's top-level entries bound into the sandbox (links are recreated as links).
_ROOT_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Where root keeps a hard-linked copy of a root file system the sandbox user cannot reach (e.g. one
# under /root, mode 700): bubblewrap runs as that user and must be able to open what it binds.
_SHARED_ROOTFS_DIR = "/var/cache/fr_agents/bwrap"
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
# Run as the launcher: move itself into the session cgroup(s), then become bwrap.
_CGROUP_LAUNCHER = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
)


def rootfs() -> Path | None:
    """The sandbox image's root file system (``$FR_AGENTS_BWRAP_ROOTFS`` or the default recipe's
    debootstrapped tree), or None when it has not been built."""
    from tools_sandbox.image import rootfs_dir

    p = Path(os.environ.get("FR_AGENTS_BWRAP_ROOTFS") or rootfs_dir())
    return p if (p / "usr" / "bin" / "python3").exists() else None


def find_python() -> str | None:
    """The sandbox's Python (``/usr/bin/python3`` of the image's root file system), or None."""
    root = rootfs()
    if root is None:
        return None
    for cand in ("usr/bin/python3", "usr/local/bin/python3"):
        if os.access(root / cand, os.X_OK):
            return "/" + cand
    return None


def _reachable_by_sandbox_user(path: Path) -> bool:
    """True when uid 65534 can walk to ``path`` (every ancestor searchable by others)."""
    for a in [path, *path.parents]:
        try:
            if not os.stat(a).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


_shared_lock = threading.Lock()


def _bindable_rootfs(root: Path) -> Path:
    """``root`` itself, or (when running as root and uid 65534 cannot reach it) a hard-linked copy
    under :data:`_SHARED_ROOTFS_DIR` (made once, in a root-owned folder no one else can write)."""
    if os.geteuid() != 0 or _reachable_by_sandbox_user(root):
        return root
    shared = Path(_SHARED_ROOTFS_DIR)
    dest = shared / root.name
    with _shared_lock:
        if (dest / "usr" / "bin" / "python3").exists():
            return dest
        shared.mkdir(parents=True, exist_ok=True, mode=0o755)
        os.chmod(shared, 0o755)
        for a in [shared, *shared.parents]:
            st = os.stat(a)
            if st.st_uid != 0 or st.st_mode & 0o022:
                raise RuntimeError(
                    f"{a} is not a root-owned folder only root can write; cannot share the "
                    f"sandbox root file system there (set FR_AGENTS_CACHE to a folder others can read)"
                )
        partial = shared / f".{root.name}.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        r = subprocess.run(["cp", "-al", str(root), str(partial)], capture_output=True, text=True)
        if r.returncode != 0:  # another file system: copy
            shutil.rmtree(partial, ignore_errors=True)
            r = subprocess.run(["cp", "-a", str(root), str(partial)], capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(
                f"cannot copy the sandbox root file system to {dest}: {r.stderr.strip()[-300:]}"
            )
        os.chmod(partial, 0o755)
        try:
            partial.rename(dest)
        except OSError:  # another process made it first
            shutil.rmtree(partial, ignore_errors=True)
        return dest


def _drop_kwargs() -> dict:
    if os.geteuid() == 0:
        return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
    return {}


def _system_binds(root: Path | None = None) -> list[str]:
    """Read-only binds of the image root file system's ``/usr``, ``/etc`` and the links into ``/usr``."""
    root = _bindable_rootfs(root or rootfs() or Path("/nonexistent"))
    args: list[str] = []
    for name in _ROOT_DIRS:
        p = root / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), f"/{name}"]
        elif p.is_dir():
            args += ["--ro-bind", str(p), f"/{name}"]
    return args


def build_argv(
    label: str,
    limits: SandboxLimits,
    python: str,
    worker_cfg: str,
    data_fds: dict[str, int],
    root: Path | None = None,
) -> list[str]:
    """The full bwrap command line of one worker (``root``: the image root file system, default
    :func:`rootfs`)."""
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
        *_system_binds(root),
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


def _all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _kill_children(parent: int, candidates: Iterable[int]) -> int:
    """SIGKILL each of ``candidates`` whose parent is ``parent``; returns how many. The check and the
    signal go through one pidfd, so a pid freed and reused in between is never hit."""
    killed = 0
    for pid in candidates:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (or pidfds unsupported: the caller falls back)
            continue
        try:
            if proc_parent(pid) == parent:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return killed


class BwrapState(SessionState):
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.cgroup: SessionCgroup | None = None

    def kill_worker(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # Inside out. bwrap's child is the init of the session's pid namespace: killed, it takes every
        # process of the namespace down with it (the kernel reaps them), and bwrap, our child, reaps it
        # and exits. Every process is then reaped by its own parent, and nothing of the session is
        # left when this returns. Killing bwrap first (below, the fallback) orphans that init
        # (--die-with-parent kills it): its zombie waits for the host's pid 1, which on some hosts
        # reaps every ~2 s, and holds the session's cgroup until then.
        if proc.poll() is None:
            candidates = self.cgroup.pids() if self.cgroup is not None else _all_pids()
            if _kill_children(proc.pid, candidates):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
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
        self,
        limits: SandboxLimits | None = None,
        python: str | None = None,
        use_cgroups: bool = True,
        root: str | Path | None = None,
    ) -> None:
        state = BwrapState()
        super().__init__(limits, state)
        self._st = state
        self.root = Path(root) if root is not None else rootfs()
        if self.root is None:
            raise RuntimeError(_NO_ROOTFS)
        self.python = python or find_python()
        if self.python is None:
            raise RuntimeError(_NO_ROOTFS)
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
            argv = build_argv(self.label, self.limits, self.python, cfg, fds, self.root)
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
        return False, _NO_ROOTFS
    try:
        binds = _system_binds()
    except (OSError, RuntimeError) as e:
        return False, f"the sandbox root file system cannot be bound: {e}"
    argv = [
        exe,
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        *binds,
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
