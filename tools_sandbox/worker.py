"""The in-sandbox worker: a long-lived Python process that runs requests from the host.

This file is **stdlib only** and self-contained: the host passes its source to ``python3 -c`` inside
the sandbox (Docker container or bubblewrap namespace), so nothing needs to be installed there.
The host also imports :func:`encode_frame` / :func:`decode_header` from it, so both ends share one
definition of the wire format.

Protocol (over the worker's stdin/stdout): each message is a *frame*, a 4-byte big-endian length
followed by that many bytes of UTF-8 JSON. The worker first sends ``{"ready": true, ...}``, then
answers each request with exactly one response frame, echoing the request's ``"id"``:

* ``{"op": "python", "code": str}`` runs code in one persistent namespace (state survives across
  calls); a final bare expression is echoed like a REPL;
* ``{"op": "shell", "cmd": str, "stdin": base64?}`` runs ``/bin/sh -c cmd``; its standard input is
  ``/dev/null``, or a pipe holding ``stdin`` (at most :data:`MAX_STDIN` bytes, then end of file). A
  harness reads a per-run secret this way (:mod:`tools_sandbox.sealed`): not in argv, environment or
  files, and gone from the pipe once read;
* ``{"op": "write", "path": str, "data": base64}`` / ``{"op": "read", "path": str}``;
* ``{"op": "ping"}``.

Output capture: for each call, file descriptors 1 and 2 are pointed at fresh pipes that a reader
thread drains, keeping the first ``output_bytes`` of each stream and counting the rest, so C code and
child processes are captured too and a flood of output cannot block or exhaust memory. The protocol
itself uses private duplicates of the original stdin/stdout.

After every call the worker cleans up after the code: it kills every other process in the sandbox's
PID namespace (children that outlive the call, fork-bomb survivors) and reaps zombies, restores
signal handlers, ``sys.stdout``/``sys.stderr`` and timers, and checks its own health (file
descriptors, processes). When the code left the worker unusable the response says
``"restart": true`` and the host replaces the worker.
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import json
import linecache
import os
import queue
import select
import signal
import struct
import sys
import threading
import time
import traceback

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
MAX_STDIN = 16 * 1024  # fits in an empty pipe's buffer: written whole before the command starts
_PR_SET_DUMPABLE = 4


def encode_frame(msg: dict) -> bytes:
    """One wire frame: 4-byte big-endian length, then compact UTF-8 JSON."""
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return _HEADER.pack(len(body)) + body


def decode_header(header: bytes) -> int:
    """The body length announced by a 4-byte header (raises ValueError when absurd)."""
    (n,) = _HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    return n


# ----------------------------------------------------------------------------- worker side


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Drain:
    """A persistent thread that drains the two capture pipes of the current call."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.jobs: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="fr-drain", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fds = self.jobs.get()
            bufs = {fd: bytearray() for fd in fds}
            totals = dict.fromkeys(fds, 0)
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            live = set(fds)
            while live:
                for fd, _ev in poller.poll():
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        poller.unregister(fd)
                        live.discard(fd)
                        os.close(fd)
                        continue
                    totals[fd] += len(chunk)
                    room = self.cap - len(bufs[fd])
                    if room > 0:
                        bufs[fd] += chunk[:room]
            self.done.put([(bytes(bufs[fd]), totals[fd]) for fd in fds])


class Worker:
    """The request loop. ``cfg`` comes from the host as JSON in ``argv[1]``."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.cap = int(cfg.get("output_bytes", 65536))
        self.pids_limit = int(cfg.get("pids", 0))
        self.nofile = int(cfg.get("nofile", 0))
        self.workdir = cfg.get("workdir", "/work")
        # In a fresh PID namespace the worker is pid 1 (Docker) or 2 (bwrap's init is 1). Only
        # there may it kill "every other process": never run that on a host.
        self.own_pidns = bool(cfg.get("kill_strays", False)) and self.pid <= 2
        self.ns: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = 0
        self._not_dumpable()
        self._apply_rlimits(cfg.get("rlimits", {}))
        self.proto_in = os.dup(0)
        self.proto_out = os.dup(1)
        self.devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(self.devnull, fd)
        self.sys_stdout, self.sys_stderr = sys.stdout, sys.stderr
        self.signals = {}
        for s in signal.valid_signals():
            if s in (signal.SIGKILL, signal.SIGSTOP):
                continue
            with contextlib.suppress(OSError, ValueError):
                self.signals[s] = signal.getsignal(s)
        self.drain = _Drain(self.cap)
        # Spare descriptors, closed after each call so that the worker's own bookkeeping (/proc
        # scans, the fd count) still works when the user's code has used up every descriptor.
        self.reserve: list[int] = []
        self._refill_reserve()
        with contextlib.suppress(OSError):
            os.chdir(self.workdir)

    def _refill_reserve(self, n: int = 8) -> None:
        with contextlib.suppress(OSError):
            while len(self.reserve) < n:
                self.reserve.append(os.open(os.devnull, os.O_RDONLY))

    def _release_reserve(self) -> None:
        while self.reserve:
            os.close(self.reserve.pop())

    @staticmethod
    def _not_dumpable() -> None:
        """``prctl(PR_SET_DUMPABLE, 0)``: the processes a call starts (same uid) can no longer open
        this worker's ``/proc/<pid>/{mem,fd,environ}`` or ptrace it, so they cannot read a request
        (a secret meant for a harness) from its memory or write frames into its protocol pipe.
        Best effort: without ctypes the worker runs as before."""
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        except (ImportError, OSError, AttributeError):
            pass

    @staticmethod
    def _apply_rlimits(limits: dict) -> None:
        import resource

        for name, value in limits.items():
            res = getattr(resource, "RLIMIT_" + name.upper(), None)
            if res is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(res, (int(value), int(value)))

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        _write_all(
            self.proto_out, encode_frame({"ready": True, "pid": self.pid, "python": sys.version.split()[0]})
        )
        while True:
            header = _read_exact(self.proto_in, 4)
            if header is None:
                return
            body = _read_exact(self.proto_in, decode_header(header))
            if body is None:
                return
            req: dict = {}
            try:
                req = json.loads(body)
                resp = self.handle(req)
            except Exception as e:  # noqa: BLE001 - a broken request must not kill the worker
                resp = {"status": "error", "error": f"worker: {type(e).__name__}: {e}", "exit_code": None}
            finally:
                if os.getpid() != self.pid:  # a fork of the worker must never answer
                    os._exit(0)
            resp["id"] = req.get("id") if isinstance(req, dict) else None
            _write_all(self.proto_out, encode_frame(resp))

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "ping":
            return {"status": "ok", "pong": True}
        if op in ("python", "shell"):
            return self._run_captured(op, req)
        if op == "write":
            return self._file_op(self._write, req)
        if op == "read":
            return self._file_op(self._read, req)
        return {"status": "error", "error": f"unknown op {op!r}", "exit_code": None}

    # ------------------------------------------------------------------ code

    def _run_captured(self, op: str, req: dict) -> dict:
        try:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
        except OSError as e:
            return {
                "status": "resources",
                "error": f"cannot create pipes: {e}",
                "restart": True,
                "exit_code": None,
            }
        self.drain.jobs.put((out_r, err_r))
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        status, exit_code = "ok", 0
        try:
            if op == "python":
                status, exit_code = self._exec(req.get("code", ""))
            else:
                status, exit_code = self._shell(req.get("cmd", ""), req.get("stdin"))
        finally:
            if os.getpid() != self.pid:
                os._exit(0)
            self._flush()
            os.dup2(self.devnull, 1)
            os.dup2(self.devnull, 2)
        self._release_reserve()
        procs = self._kill_strays()
        self._restore()
        try:
            (out, out_n), (err, err_n) = self.drain.done.get(timeout=2.0)
        except queue.Empty:
            return {
                "status": "resources",
                "error": "output pipes stayed open after the call",
                "restart": True,
                "exit_code": exit_code,
            }
        resp: dict = {
            "status": status,
            "exit_code": exit_code,
            "stdout": self._text(out, out_n),
            "stderr": self._text(err, err_n),
            "truncated": out_n > self.cap or err_n > self.cap,
        }
        if self.pids_limit and procs >= self.pids_limit - 2:
            resp.update(status="pids", restart=True)
        if self.nofile:
            try:
                open_fds = len(os.listdir("/proc/self/fd"))
            except OSError:
                open_fds = self.nofile
            if open_fds > self.nofile - 16:
                resp.update(
                    status="resources",
                    restart=True,
                    error=f"the code left {open_fds} file descriptors open (limit {self.nofile})",
                )
        if status == "oom":
            resp["restart"] = True
        self._refill_reserve()
        return resp

    def _text(self, data: bytes, total: int) -> str:
        text = data.decode("utf-8", errors="replace")
        if total > self.cap:
            text += f"\n[output truncated: {total} bytes written, only the first {self.cap} kept]"
        return text

    def _exec(self, code: str) -> tuple[str, int]:
        self.cells += 1
        name = f"<cell {self.cells}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), self.ns)  # noqa: S102 - running code is the point
            if last is not None:
                value = eval(compile(last, name, "eval"), self.ns)  # noqa: S307
                if value is not None:
                    print(repr(value))
            return "ok", 0
        except SystemExit as e:
            if os.getpid() != self.pid:
                os._exit(0)
            code_ = e.code
            if code_ is None:
                return "ok", 0
            if isinstance(code_, int):
                return ("ok" if code_ == 0 else "error"), code_
            print(code_, file=sys.stderr)
            return "error", 1
        except MemoryError:
            if os.getpid() != self.pid:
                os._exit(1)
            self.ns.clear()  # free what we can before reporting
            print("MemoryError: the code ran out of memory", file=sys.stderr)
            return "oom", 1
        except BaseException:  # noqa: BLE001 - user code may raise anything
            if os.getpid() != self.pid:
                os._exit(1)
            etype, value, tb = sys.exc_info()
            # Drop the worker's own frame so the traceback starts in the user's cell.
            tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
            try:
                traceback.print_exception(etype, value, tb, file=sys.stderr)
            except Exception:  # noqa: BLE001
                os.write(2, f"{etype.__name__}: <unprintable>\n".encode())
            return "error", 1

    def _shell(self, cmd: str, stdin_b64: str | None = None) -> tuple[str, int]:
        import subprocess

        stdin: int = subprocess.DEVNULL
        if stdin_b64:
            data = base64.b64decode(stdin_b64)
            if len(data) > MAX_STDIN:
                os.write(2, f"stdin: {len(data)} bytes, at most {MAX_STDIN}\n".encode())
                return "error", 2
            stdin, w = os.pipe()
            try:
                _write_all(w, data)
            finally:
                os.close(w)  # the command reads the data, then end of file
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=stdin)
        except OSError as e:
            os.write(2, f"cannot run /bin/sh: {e}\n".encode())
            return "error", 127
        finally:
            if stdin != subprocess.DEVNULL:
                os.close(stdin)  # only the command holds the data now
        rc = proc.wait()
        return ("ok" if rc == 0 else "error"), rc

    def _flush(self) -> None:
        for stream in (sys.stdout, sys.stderr, self.sys_stdout, self.sys_stderr):
            with contextlib.suppress(Exception):  # the user may have closed or replaced it
                stream.flush()

    # ------------------------------------------------------------------ clean-up after a call

    def _other_pids(self) -> list[int]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                pid = int(name)
                if pid != self.pid and pid != 1:
                    out.append(pid)
        return out

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _kill_strays(self) -> int:
        """Kill every other process in the sandbox; returns how many there were."""
        if not self.own_pidns:
            self._reap()
            return 0
        others = self._other_pids()
        count = len(others) + 1
        deadline = time.monotonic() + 2.0
        while others and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(-1, signal.SIGKILL)  # all processes of this namespace but us and init
            self._reap()
            others = self._other_pids()
            if others:
                time.sleep(0.002)
        self._reap()
        return count

    def _restore(self) -> None:
        sys.stdout, sys.stderr = self.sys_stdout, self.sys_stderr
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)
        except (OSError, ValueError):
            pass
        for s, handler in self.signals.items():
            try:
                if signal.getsignal(s) is not handler:
                    signal.signal(s, handler)
            except (OSError, ValueError, TypeError):
                pass
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_SETMASK, [])

    # ------------------------------------------------------------------ files

    def _path(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.workdir, path)

    def _file_op(self, fn, req: dict) -> dict:  # noqa: ANN001
        try:
            return fn(req)
        except OSError as e:
            return {"status": "error", "error": f"{type(e).__name__}: {e}", "exit_code": None}

    def _write(self, req: dict) -> dict:
        path = self._path(req["path"])
        data = base64.b64decode(req.get("data", ""))
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return {"status": "ok", "bytes": len(data)}

    def _read(self, req: dict) -> dict:
        path = self._path(req["path"])
        limit = int(req.get("max_bytes", 16 * 1024 * 1024))
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return {"status": "error", "error": f"{path} is larger than {limit} bytes", "exit_code": None}
        return {"status": "ok", "data": base64.b64encode(data).decode("ascii")}


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[0]) if argv else {}
    Worker(cfg).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
