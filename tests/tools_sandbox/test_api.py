"""The sandbox API on both backends: persistence, shell, files, limits, results, pool, clean-up."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.tools_sandbox.conftest import BACKENDS, TEST_LIMITS, docker_containers_of_this_process, require
from tools_sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxPool,
    SandboxUnavailable,
    live_sessions,
    open_sandbox,
    resolve_backend,
)
from tools_sandbox.owner import LABEL, OWNER_LABEL, proc_parent
from tools_sandbox.reaper import _bwrap_processes, leftovers
from tools_sandbox.reaper import gc as reaper_gc


def test_state_persists_and_repl_echo(sb) -> None:
    assert sb.run_python("import math\nx = 20").stdout == ""
    r = sb.run_python("x += 1\nmath.factorial(x) % 1000")
    assert r.ok and r.stdout == "0\n" and r.exit_code == 0
    assert sb.run_python("print(x)").stdout == "21\n"
    assert sb.run_python("None").stdout == ""


def test_exceptions_and_exit_codes(sb) -> None:
    r = sb.run_python("def f():\n    raise ValueError('boom')\nf()")
    assert r.status == "error" and r.exit_code == 1 and not r.restarted
    assert "ValueError: boom" in r.stderr and 'File "<cell' in r.stderr and "worker" not in r.stderr
    r = sb.run_python("import sys\nsys.exit(3)")
    assert (r.status, r.exit_code) == ("error", 3)
    assert sb.run_python("raise SystemExit").ok
    r = sb.run_python("def broken(:\n  pass")
    assert r.status == "error" and "SyntaxError" in r.stderr
    assert sb.run_python("print('alive')").stdout == "alive\n"


def test_shell_and_captured_child_output(sb) -> None:
    r = sb.run_shell("echo out; echo err >&2; exit 4")
    assert (r.stdout, r.stderr, r.exit_code, r.status) == ("out\n", "err\n", 4, "error")
    r = sb.run_python(
        "import os, subprocess\nos.write(1, b'raw\\n')\n"
        "subprocess.run(['echo', 'child'])\nrc = os.system('echo sys >&2')"
    )
    assert r.stdout == "raw\nchild\n" and r.stderr == "sys\n"
    assert sb.run_shell("pwd; id -u").stdout == "/work\n65534\n"
    assert sb.run_shell("python3 -c 'import sys; print(sys.version_info[0])'").stdout == "3\n"


def test_files(sb) -> None:
    sb.write_file("sub/dir/a.bin", bytes(range(256)))
    assert sb.read_file("/work/sub/dir/a.bin") == bytes(range(256))
    sb.write_file("t.txt", "héllo")
    assert sb.run_python("print(open('t.txt', encoding='utf-8').read())").stdout == "héllo\n"
    with pytest.raises(SandboxError, match="No such file"):
        sb.read_file("missing.txt")
    with pytest.raises(SandboxError):
        sb.write_file("/usr/evil.txt", "x")


def test_output_cap_marks_truncation(sb) -> None:
    r = sb.run_python("print('a' * 200_000)\nimport sys\n_ = sys.stderr.write('b' * 100_000)")
    cap = TEST_LIMITS.output_bytes
    assert r.truncated and r.ok
    assert r.stdout.startswith("a" * cap) and "[output truncated: 200001 bytes written" in r.stdout
    assert "[output truncated: 100000 bytes written" in r.stderr


def test_timeout_kills_restarts_and_resets_state(sb) -> None:
    sb.run_python("keep = 1")
    starts = sb.starts
    t0 = time.monotonic()
    r = sb.run_python("import time\ntime.sleep(30)", timeout=0.5)
    assert time.monotonic() - t0 < 1.5
    assert r.timed_out and r.status == "timeout" and r.restarted and r.exit_code is None
    assert "timed out" in r.stderr
    r = sb.run_python("print(globals().get('keep'))")
    assert r.stdout == "None\n" and sb.starts == starts + 1


def test_timeout_argument_is_validated(sb) -> None:
    with pytest.raises(ValueError, match="timeout"):
        sb.run_python("1", timeout=0)
    with pytest.raises(TypeError, match="code"):
        sb.run_python(b"1")  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_removes_everything_and_is_idempotent(backend) -> None:
    require(backend)
    sb = open_sandbox(backend, TEST_LIMITS)
    sb.run_python("import subprocess\nsubprocess.Popen(['sleep', '300'])")
    ident = sb.container_id if backend == "docker" else sb.label
    sb.close()
    sb.close()
    assert sb.closed and not sb.alive()
    with pytest.raises(SandboxError, match="closed"):
        sb.run_python("1")
    assert sb not in live_sessions()
    left = leftovers()
    assert not any(ident in x for x in left["bwrap_processes"] + left["cgroups"])
    if backend == "docker":
        assert not any(ident.startswith(c) for c in docker_containers_of_this_process())


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (its children, theirs...), read from /proc's parent links."""
    parent_of = {}
    for name in os.listdir("/proc"):
        parent = proc_parent(int(name)) if name.isdigit() else None
        if parent is not None:
            parent_of[int(name)] = parent
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - out
        out |= frontier
    return out


@pytest.mark.bwrap
@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup", "no-cgroup"])
def test_bwrap_close_leaves_no_process_not_even_a_zombie_for_the_hosts_init(use_cgroups) -> None:
    """Every process of the session is reaped by its own parent before close() returns: none is left
    as a zombie orphaned to the host's pid 1 (which reaps when it gets to it; ~2 s on some hosts),
    and the session's cgroup can go at once."""
    require("bwrap")
    from tools_sandbox.bwrap import BwrapSandbox

    sb = BwrapSandbox(TEST_LIMITS, use_cgroups=use_cgroups)
    try:
        sb.run_python("x = 1")
        bwrap = sb._st.proc.pid
        session = _descendants(bwrap) | {bwrap}
    finally:
        sb.close()
    assert len(session) == 3  # bwrap, the namespace's init (bwrap's child), the worker
    assert [p for p in session if os.path.exists(f"/proc/{p}")] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_garbage_collected_session_is_torn_down(backend) -> None:
    require(backend)
    sb = open_sandbox(backend, TEST_LIMITS)
    sb.run_python("1")
    ident = sb.container_id if backend == "docker" else sb.label
    del sb
    gc.collect()
    if backend == "docker":
        deadline = time.monotonic() + 10
        while ident in "".join(docker_containers_of_this_process()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(c.startswith(ident[:12]) for c in docker_containers_of_this_process())
    else:
        assert all(label != ident for _, label in _bwrap_processes())


@pytest.mark.parametrize("backend", BACKENDS)
def test_reaper_removes_sandboxes_of_a_killed_owner(backend, tmp_path) -> None:
    """A process that opens a sandbox and is SIGKILLed leaves it behind; `gc` removes it."""
    require(backend)
    script = textwrap.dedent(f"""
        import sys, time
        from tools_sandbox import open_sandbox, SandboxLimits
        sb = open_sandbox({backend!r}, SandboxLimits(memory_mb=128, pids=16))
        sb.run_python("import subprocess; subprocess.Popen(['sleep', '300'])")
        print("READY", flush=True)
        time.sleep(300)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert proc.stdout.readline().strip() == "READY"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    owner_prefix = f":{proc.pid}:"

    def orphans() -> list[str]:
        if backend == "docker":
            out = subprocess.run(
                [
                    "docker",
                    "ps",
                    "-a",
                    "--filter",
                    f"label={LABEL}",
                    "--format",
                    f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}',
                ],
                capture_output=True,
                text=True,
            )
            return [ln for ln in out.stdout.splitlines() if owner_prefix in ln]
        return [label for _, label in _bwrap_processes() if label.startswith(f"frsbx-{proc.pid}-")]

    if backend == "bwrap":
        # bwrap runs --die-with-parent: the kernel already took the sandbox down with its owner.
        deadline = time.monotonic() + 5
        while orphans() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        assert orphans(), "the killed owner's container should still be there before gc"
    removed = reaper_gc()
    assert orphans() == []
    if backend == "docker":
        assert removed["docker"]
    else:
        # its cgroup (when cgroups are in use) is only removed by the reaper
        assert not any(f"frsbx-{proc.pid}-" in p for p in leftovers()["cgroups"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_hands_out_fresh_sessions_and_never_reuses(backend) -> None:
    require(backend)
    with SandboxPool(backend, TEST_LIMITS, size=2) as pool:
        assert pool.wait_ready(60)
        t0 = time.perf_counter()
        a = pool.acquire()
        acquire_s = time.perf_counter() - t0
        assert acquire_s < 0.05, f"pooled acquire took {acquire_s * 1000:.1f} ms"
        a.run_python("secret = 1")
        a.close()
        b = pool.acquire()
        assert b is not a and b.calls == 0
        assert b.run_python("print(globals().get('secret'))").stdout == "None\n"
        b.close()
        c = pool.acquire(wait_s=30)
        assert c.alive()
        c.close()
    assert pool.idle() == 0


def test_limits_validation() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="cpus"):
        SandboxLimits(cpus=-1)
    with pytest.raises(ValueError, match="pids"):
        SandboxLimits(pids="8")  # type: ignore[arg-type]


def test_auto_backend_and_unavailable_message(monkeypatch) -> None:
    import tools_sandbox.bwrap as bw
    import tools_sandbox.docker_backend as dk

    with pytest.raises(ValueError, match="backend"):
        resolve_backend("chroot")
    d_ok, b_ok = dk.docker_available()[0], bw.bwrap_available()[0]
    if d_ok:
        assert resolve_backend("auto") == "docker"
    elif b_ok:
        assert resolve_backend("auto") == "bwrap"
    monkeypatch.setattr(dk, "docker_available", lambda image=None: (False, "no daemon (test)"))
    if b_ok:
        assert resolve_backend("auto") == "bwrap"
    monkeypatch.setattr(bw, "bwrap_available", lambda: (False, "bwrap missing (test)"))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as e:
        open_sandbox("auto")
    assert "no daemon (test)" in str(e.value) and "bwrap missing (test)" in str(e.value)
    with pytest.raises(SandboxUnavailable, match="docker"):
        open_sandbox("docker")


@pytest.mark.docker
def test_docker_container_settings() -> None:
    require("docker")
    with open_sandbox("docker", TEST_LIMITS) as sb:
        info = subprocess.run(["docker", "inspect", sb.container_id], capture_output=True, text=True).stdout
        import json

        hc = json.loads(info)[0]["HostConfig"]
        cfg = json.loads(info)[0]["Config"]
    assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
    assert hc["Memory"] == hc["MemorySwap"] == TEST_LIMITS.memory_mb << 20
    assert hc["PidsLimit"] == TEST_LIMITS.pids and hc["NanoCpus"] == int(TEST_LIMITS.cpus * 1e9)
    assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
    assert set(hc["Tmpfs"]) == {"/work", "/tmp"}
    assert cfg["User"] == "65534:65534" and cfg["Labels"][LABEL] == "1" and OWNER_LABEL in cfg["Labels"]


@pytest.mark.bwrap
def test_bwrap_namespaces_and_mounts() -> None:
    require("bwrap")
    with open_sandbox("bwrap", TEST_LIMITS) as sb:
        r = sb.run_python(
            "import os, socket\n"
            "print(sorted(n for _, n in socket.if_nameindex()))\n"
            "print(os.getpid(), os.getuid())\n"
            "print(sorted(os.listdir('/')))\n"
            "print(os.statvfs('/work').f_blocks * os.statvfs('/work').f_frsize)"
        )
        lines = r.stdout.splitlines()
        assert lines[0] == "['lo']"
        assert lines[1] == "2 65534"
        assert "root" not in lines[2] and "home" not in lines[2]
        assert int(lines[3]) == TEST_LIMITS.tmpfs_mb << 20
        if sb.cgroup is not None:
            mem = sb.cgroup.dirs.get("memory")
            if mem is not None:
                assert (mem / "memory.limit_in_bytes").read_text().strip() == str(TEST_LIMITS.memory_mb << 20)
