"""Hostile programs against both backends.

For every program: the host is unaffected, the call returns within deadline + 1 s with a clear
status, and the next call on the same session works. One session per backend serves the whole
module, so each test also proves the session recovers from the previous one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field

import pytest

from tests.tools_sandbox.conftest import BACKENDS, TEST_LIMITS, require
from tools_sandbox import create_sandbox

DEADLINE = 2.0
KILLED = {"timeout", "oom", "pids", "crashed", "resources"}


@dataclass
class Hostile:
    name: str
    code: str
    statuses: set[str]  # acceptable result statuses
    forbid: list[str] = field(default_factory=list)  # strings that must not appear in stdout/stderr
    expect: list[str] = field(default_factory=list)  # strings that must appear in stdout


# Listener and canaries on the host, shared by the programs that probe them.
_LISTENER = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
_LISTENER.bind(("127.0.0.1", 0))
_LISTENER.listen(8)
_LISTENER.setblocking(False)
_PORT = _LISTENER.getsockname()[1]
_UDP = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_UDP.bind(("127.0.0.1", 0))
_UDP.setblocking(False)
_UDP_PORT = _UDP.getsockname()[1]
_SECRET = f"fr-secret-{os.getpid()}-{time.time_ns()}"
_CANARY_DIR = "/root" if os.access("/root", os.W_OK) else os.path.expanduser("~")
_CANARY = os.path.join(_CANARY_DIR, f".fr_sandbox_canary_{os.getpid()}")
_ESCAPE_PATHS = ["/etc/fr_evil", "/usr/fr_evil", "/fr_evil", "/root/fr_evil", "/work/../etc/fr_evil2"]

HOSTILE = [
    Hostile(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        {"timeout", "pids"},
    ),
    Hostile("fork_bomb_raising", "import os\nwhile True:\n    os.fork()", {"pids", "timeout", "error"}),
    Hostile(
        "subprocess_bomb",
        "import subprocess\nps = [subprocess.Popen(['sleep', '100']) for _ in range(500)]",
        {"pids", "error", "timeout"},
    ),
    Hostile("memory_bomb", "a = []\nwhile True:\n    a.append(bytearray(8 << 20))", {"oom"}),
    Hostile("memory_bomb_bytes", "x = b'x' * (1 << 31)", {"oom"}),
    Hostile("infinite_loop", "while True:\n    pass", {"timeout"}),
    Hostile("c_spin_huge_pow", "x = pow(3, 10**9)", {"timeout", "oom"}),
    Hostile("sleep_forever", "import time\ntime.sleep(10_000)", {"timeout"}),
    Hostile(
        "connect_host_loopback",
        f"import socket\ns = socket.socket()\ns.settimeout(1)\ntry:\n    s.connect(('127.0.0.1', {_PORT}))\n"
        "    s.sendall(b'LEAK')\n    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', e)",
        {"ok"},
        forbid=["CONNECTED"],
        expect=["BLOCKED"],
    ),
    Hostile(
        "udp_to_host_loopback",
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n"
        f"    s.sendto(b'LEAK', ('127.0.0.1', {_UDP_PORT}))\nexcept OSError as e:\n    print('BLOCKED', e)",
        {"ok"},
    ),
    Hostile(
        "connect_public_address",
        "import socket\nfor host in ('1.1.1.1', '8.8.8.8', '151.101.0.223'):\n    s = socket.socket()\n"
        "    s.settimeout(1)\n    try:\n        s.connect((host, 80))\n        print('CONNECTED', host)\n"
        "    except OSError as e:\n        print('BLOCKED', e)",
        {"ok"},
        forbid=["CONNECTED"],
        expect=["BLOCKED"],
    ),
    Hostile(
        "dns_lookup",
        "import socket\ntry:\n    print('RESOLVED', socket.getaddrinfo('deb.debian.org', 80))\n"
        "except OSError as e:\n    print('BLOCKED', e)",
        {"ok"},
        forbid=["RESOLVED"],
        expect=["BLOCKED"],
    ),
    Hostile(
        "read_etc_shadow",
        "try:\n    print(open('/etc/shadow').read())\nexcept OSError as e:\n    print('DENIED', e)",
        {"ok"},
    ),
    Hostile(
        "read_root_home",
        f"import os\nfor p in ('/root', {_CANARY_DIR!r}):\n    try:\n        print(p, os.listdir(p))\n"
        f"    except OSError as e:\n        print('DENIED', e)\ntry:\n    print(open({_CANARY!r}).read())\n"
        "except OSError as e:\n    print('DENIED', e)",
        {"ok"},
        forbid=[_SECRET, repr(os.path.basename(_CANARY))],
    ),  # as a listing entry
    Hostile(
        "read_project_source",
        f"try:\n    print(open({os.path.abspath(__file__)!r}).read())\n"
        "except OSError as e:\n    print('DENIED', e)",
        {"ok"},
        forbid=["_ESCAPE_PATHS"],
        expect=["DENIED"],
    ),
    Hostile(
        "write_outside_workdir",
        f"for p in {_ESCAPE_PATHS!r}:\n    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n"
        "    except OSError as e:\n        print('DENIED', e)",
        {"ok"},
        expect=["DENIED"],
    ),
    Hostile(
        "kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", {"ok", "error", "crashed"}
    ),
    Hostile("kill_everything", "import os, signal\nos.kill(-1, signal.SIGKILL)", {"ok", "error", "crashed"}),
    # In Docker the worker is PID 1, which ignores signals it has no handler for: "ok" is right there.
    Hostile("kill_self", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", {"crashed", "ok"}),
    Hostile(
        "kill_host_process",
        "import os, signal, sys\nos.kill(int(sys.argv[-1] if False else HOST_PID), 9)",
        {"ok", "error"},
    ),
    Hostile(
        "huge_stdout", "import sys\nsys.stdout.write('x' * 50_000_000)", {"ok"}, expect=["[output truncated"]
    ),
    Hostile("stdout_flood_forever", "while True:\n    print('y' * 1000)", {"timeout"}),
    Hostile(
        "invalid_utf8",
        "import os, sys\nsys.stdout.buffer.write(b'\\xff\\xfe bad \\xc3')\n"
        "sys.stdout.flush()\nos.write(2, b'\\x80')",
        {"ok"},
        expect=["bad"],
    ),
    Hostile("sigsegv_sent", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", {"crashed", "ok"}),
    Hostile("real_segfault", "import ctypes\nctypes.string_at(0)", {"crashed"}),
    Hostile("sigstop_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", {"timeout", "ok"}),
    Hostile(
        "signal_handlers_and_timers",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGALRM, lambda *a: None)\nsignal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])",
        {"ok"},
    ),
    Hostile("zombies", "import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)", {"ok"}),
    Hostile(
        "children_outlive_call",
        "import os, subprocess\nsubprocess.Popen(['sleep', '1000'])\n"
        "os.system('(sleep 1000 &); nohup sleep 999 >/dev/null 2>&1 &')\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(1000)",
        {"ok"},
    ),
    Hostile(
        "fd_exhaustion_kept",
        "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\n"
        "except OSError as e:\n    print('EMFILE', e)",
        {"resources"},
    ),
    Hostile("fd_exhaustion_raised", "fs = [open('/dev/null') for _ in range(10**6)]", {"error", "resources"}),
    Hostile(
        "fill_tmpfs",
        "import os\ntry:\n    with open('/work/big', 'wb') as f:\n        while True:\n"
        "            f.write(b'\\0' * (1 << 20))\n            f.flush()\nexcept OSError as e:\n"
        "    print('FULL', e)\ntry:\n    with open('/tmp/big', 'wb') as f:\n"
        "        while True:\n            f.write(b'\\0' * (1 << 20))\n            f.flush()\n"
        "except OSError as e:\n    print('FULL', e)",
        {"ok"},
        expect=["FULL"],
    ),
    Hostile("close_stdout_fds", "import os, sys\nsys.stdout = None\nos.close(1)\nos.close(2)", {"ok"}),
    Hostile("os_exit", "import os\nos._exit(3)", {"crashed"}),
    Hostile("deep_recursion", "def f():\n    return f()\nf()", {"error"}),
    Hostile(
        "forge_protocol_frames",
        "import os\nfor fd in range(3, 8):\n    try:\n"
        "        os.write(fd, b'\\xff' * 64)\n    except OSError:\n        pass",
        {"ok", "crashed", "timeout"},
    ),
    Hostile(
        "forge_future_responses",
        "import gc, json, os, struct\nw = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')\n"
        "for i in range(200):\n"
        "    body = json.dumps({'status': 'ok', 'stdout': 'FORGED', 'exit_code': 0, 'id': i}).encode()\n"
        "    os.write(w.proto_out, struct.pack('>I', len(body)) + body)",
        {"ok"},
        forbid=["FORGED"],
    ),
    Hostile(
        "privilege_escalation",
        "import os, subprocess\ntry:\n    os.setuid(0)\n    print('ESCALATED setuid')\n"
        "except OSError as e:\n    print('DENIED', e)\n"
        "rc = subprocess.run(['mount', '-t', 'tmpfs', 'none', '/tmp'], capture_output=True).returncode\n"
        "print('ESCALATED mount' if rc == 0 else 'DENIED mount')\ntry:\n"
        "    open('/proc/sysrq-trigger', 'w').write('h')\n    print('ESCALATED sysrq')\n"
        "except OSError as e:\n    print('DENIED', e)",
        {"ok"},
        forbid=["ESCALATED"],
        expect=["DENIED"],
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    require(request.param)
    sb = create_sandbox(request.param, TEST_LIMITS)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def host_canaries():
    """A host process and a secret file that no sandbox may touch."""
    sleeper = subprocess.Popen(["sleep", "600"])
    with open(_CANARY, "w") as f:
        f.write(_SECRET)
    yield sleeper
    sleeper.kill()
    sleeper.wait()
    os.unlink(_CANARY)


def _host_unaffected(sleeper: subprocess.Popen) -> None:
    assert sleeper.poll() is None, "a host process was killed"
    with open(_CANARY) as f:
        assert f.read() == _SECRET
    for p in _ESCAPE_PATHS:
        assert not os.path.exists(os.path.normpath(p)), f"the sandbox wrote {p} on the host"
    with pytest.raises(BlockingIOError):
        _LISTENER.accept()
    with pytest.raises(BlockingIOError):
        _UDP.recvfrom(100)


@pytest.mark.parametrize("prog", HOSTILE, ids=[h.name for h in HOSTILE])
def test_hostile_program(sandbox, host_canaries, prog: Hostile) -> None:
    code = prog.code.replace("HOST_PID", str(host_canaries.pid))
    t0 = time.monotonic()
    r = sandbox.run_python(code, timeout=DEADLINE)
    elapsed = time.monotonic() - t0
    assert elapsed <= DEADLINE + 1.0, f"{prog.name} took {elapsed:.2f} s"
    assert r.status in prog.statuses, (
        f"{prog.name}: status {r.status!r}, stdout={r.stdout[:300]!r} stderr={r.stderr[-500:]!r}"
    )
    assert r.timed_out == (r.status == "timeout")
    if r.status in KILLED:
        assert r.restarted and r.describe() in r.stderr  # the result says what happened
    out = r.stdout + r.stderr
    for s in prog.forbid:
        assert s not in out, f"{prog.name} leaked {s!r}: {out[:500]!r}"
    for s in prog.expect:
        assert s in r.stdout, f"{prog.name}: expected {s!r} in {r.stdout[:500]!r}"
    if prog.name == "huge_stdout":
        assert r.truncated and len(r.stdout) < TEST_LIMITS.output_bytes + 200
    if prog.name == "read_etc_shadow" and os.access("/etc/shadow", os.R_OK):
        with open("/etc/shadow") as f:
            host_shadow = f.read()
        root_line = next((ln for ln in host_shadow.splitlines() if ln.startswith("root:")), None)
        assert root_line is None or root_line not in out
    _host_unaffected(host_canaries)
    # The next call works (after a restart when the worker was killed).
    nxt = sandbox.run_python("print(6 * 7)", timeout=30)
    assert nxt.status == "ok" and nxt.stdout == "42\n", nxt
    if prog.name in ("zombies", "children_outlive_call", "fork_bomb", "subprocess_bomb"):
        procs = sandbox.run_python(
            "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert len(eval(procs.stdout)) <= 2, f"processes survived the call: {procs.stdout}"


def test_at_least_25_hostile_programs() -> None:
    """``test_hostile_program`` runs every program of HOSTILE, and they are 25+ different programs
    (distinct names and distinct code), each checked against the outcomes it may have."""
    marks = [m for m in getattr(test_hostile_program, "pytestmark", []) if m.name == "parametrize"]
    assert len(marks) == 1 and marks[0].args[0] == "prog"
    run = list(marks[0].args[1])
    assert run == HOSTILE
    assert len({p.name for p in run}) == len(run) >= 25
    assert len({p.code for p in run}) == len(run)
    assert all(p.statuses and p.statuses <= {"ok", "error", *KILLED} for p in run)


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_environment_does_not_leak(backend: str, monkeypatch) -> None:
    require(backend)
    monkeypatch.setenv("FR_SANDBOX_CANARY", _SECRET)
    with create_sandbox(backend, TEST_LIMITS) as sb:
        r = sb.run_python("import os\nprint(sorted(os.environ.items()))")
        r2 = sb.run_shell("env")
    assert r.ok and r2.ok
    assert _SECRET not in r.stdout + r2.stdout
    assert "FR_SANDBOX_CANARY" not in r.stdout + r2.stdout
    assert "/root" not in r.stdout
