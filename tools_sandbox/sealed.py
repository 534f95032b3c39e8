"""Verdicts the code under test cannot forge: a per-run secret and a sealed result.

A grader that trusts an exit status, or a line on stdout, or a report file at a known path, can be
fooled by the very code it grades: ``sys.exit(0)`` before the first check, ``os._exit(0)`` from a
thread, an ``atexit`` hook, printing what the harness prints on success, writing the report itself.
A *sealed run* counts only evidence that such code cannot produce:

1. The host draws a fresh secret for every run (:func:`run_sealed`) and hands it to the harness on
   its **standard input** (:meth:`~tools_sandbox.session.Sandbox.run_shell` ``stdin=``): it is in no
   argv, environment variable, file or program text. The worker that writes it into the pipe is not
   dumpable, so other processes of the sandbox cannot read it from the worker's memory.
2. The harness (a script that starts with :data:`PRELUDE`) reads the secret to end of file and puts
   ``/dev/null`` on fd 0 **before** it loads any code under test, keeps a private duplicate of stdout
   for its verdict and points fd 1 at stderr (so the tested code's prints cannot crowd it out).
3. Only after the checks have completed does the harness write its result (the *payload*, e.g. a
   JSON test report) to a file and the line ``FR-SEALED <HMAC-SHA256(secret, payload)>`` to its
   private stdout; then it leaves with ``os._exit`` (no ``atexit`` hook or thread runs after it).
4. The host (:func:`run_sealed`) reads the payload file and accepts it only when a seal line matches
   its HMAC. Exit status is never evidence: an early exit, a crash, a kill, a timeout or a forged
   line all leave no valid seal, and the run counts as *unverified*.

What this does **not** stop: code that runs *in the harness's process* (a library imported by
pytest) can, with deliberate effort, find the secret in memory (frame or ``gc``
walking, ``/proc/self/mem``) or rewrite the harness's objects while the checks run. Graders say what
they do about that (see ``docs/DESIGN.md``, "Grader trust boundaries"); HumanEval avoids the
question by keeping its checks out of the sandbox altogether (``envs/humaneval_checker.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from tools_sandbox.result import RunResult, SandboxError

SEAL_TAG = "FR-SEALED"
_SEAL_RE = re.compile(rf"{SEAL_TAG} ([0-9a-f]{{64}})")

# The start of every harness script (stdlib only; runs under ``python3 -I -B`` in the sandbox).
PRELUDE = r'''
import hashlib as _fr_hashlib
import hmac as _fr_hmac
import os as _fr_os


def _fr_take_secret():
    """The whole of stdin (the run's secret); afterwards fd 0 is /dev/null."""
    chunks = []
    while True:
        chunk = _fr_os.read(0, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    null = _fr_os.open(_fr_os.devnull, _fr_os.O_RDONLY)
    _fr_os.dup2(null, 0)
    _fr_os.close(null)
    return b"".join(chunks).strip()


def _fr_private_stdout():
    """A private duplicate of stdout for the verdict; fd 1 then writes to stderr."""
    out = _fr_os.dup(1)
    _fr_os.dup2(2, 1)
    return out


def _fr_flush():
    """Flush Python's stdout/stderr buffers (the harness ends with os._exit, which does not)."""
    import sys
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def _fr_seal(secret, out, payload, path):
    """Write ``payload`` to ``path`` and its seal to the private stdout ``out``."""
    _fr_flush()
    with open(path, "wb") as f:
        f.write(payload)
    mac = _fr_hmac.new(secret, payload, _fr_hashlib.sha256).hexdigest()
    line = ("\n" + "FR-SEALED " + mac + "\n").encode()
    while line:
        line = line[_fr_os.write(out, line):]
'''


def new_secret() -> bytes:
    """A fresh per-run secret (hex text, so it survives any line handling)."""
    return secrets.token_hex(32).encode()


def seal_of(secret: bytes, payload: bytes) -> str:
    """The hex HMAC-SHA256 a harness writes after ``FR-SEALED`` for ``payload``."""
    return hmac.new(secret, payload, hashlib.sha256).hexdigest()


@dataclass
class SealedRun:
    """The outcome of :func:`run_sealed`.

    ``evidence`` is ``sealed`` (``payload`` is the harness's verified result), ``missing`` (no seal
    line: the harness never reached its end) or ``forged`` (seal lines, none matching the payload
    file). Only ``sealed`` runs may count as passing.
    """

    result: RunResult
    evidence: str
    payload: bytes | None = None

    @property
    def verified(self) -> bool:
        return self.evidence == "sealed"

    def output(self) -> str:
        """stdout and stderr of the run without the seal line (for people and agents to read)."""
        text = "\n".join(p for p in (self.result.stdout, self.result.stderr) if p)
        return _SEAL_RE.sub("", text).strip("\n")


def verify(secret: bytes, stdout: str, payload: bytes | None) -> str:
    """``sealed``, ``missing`` or ``forged`` (see :class:`SealedRun`)."""
    macs = _SEAL_RE.findall(stdout)
    if not macs:
        return "missing"
    if payload is not None:
        want = seal_of(secret, payload)
        if any(hmac.compare_digest(m, want) for m in macs):
            return "sealed"
    return "forged"


def run_sealed(sb: Any, cmd: str, result_path: str, timeout: float) -> SealedRun:
    """Run ``cmd`` (which starts a :data:`PRELUDE` harness writing its payload to ``result_path``)
    with a fresh secret on its stdin, and check the seal."""
    secret = new_secret()
    res = sb.run_shell(cmd, timeout=timeout, stdin=secret + b"\n")
    if not _SEAL_RE.search(res.stdout):
        return SealedRun(res, "missing")
    try:
        payload = sb.read_file(result_path)
    except SandboxError:
        payload = None
    evidence = verify(secret, res.stdout, payload)
    return SealedRun(res, evidence, payload if evidence == "sealed" else None)
