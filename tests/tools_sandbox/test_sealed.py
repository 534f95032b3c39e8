"""Sealed runs on both backends: the secret reaches the harness on stdin only, the worker cannot be
read or written by the processes it starts, and only a matching seal counts."""

from __future__ import annotations

import pytest

from tools_sandbox.sealed import PRELUDE, run_sealed, seal_of, verify

HARNESS = (
    PRELUDE
    + r"""
import sys
secret = _fr_take_secret()
out = _fr_private_stdout()
mode = sys.argv[2]
print("harness running", flush=True)
if mode == "seal":
    _fr_seal(secret, out, b"the payload", sys.argv[1])
elif mode == "wrong-key":
    _fr_seal(b"guess", out, b"the payload", sys.argv[1])
_fr_os._exit(0)
"""
)


def test_stdin_reaches_the_command_and_nothing_else(sb) -> None:
    r = sb.run_shell(
        "read x; echo got=$x; cat /proc/self/environ | tr '\\0' '\\n' | grep -c s3cr3t; true",
        stdin=b"s3cr3t-value\n",
    )
    assert r.ok and "got=s3cr3t-value" in r.stdout and r.stdout.strip().endswith("0"), r
    assert sb.run_shell("cat").stdout == ""  # without stdin=: /dev/null
    with pytest.raises(ValueError, match="stdin"):
        sb.run_shell("true", stdin=b"x" * (64 * 1024))


def test_processes_cannot_read_or_write_the_worker(sb) -> None:
    """The worker is not dumpable: its children (same uid) cannot open its memory, its environment
    or its descriptors (the protocol pipe to the host)."""
    worker = sb.run_python("import os\nos.getpid()").stdout.strip()
    code = (
        "import os, sys\n"
        f"pid = {worker}\n"
        "for path in [f'/proc/{pid}/mem', f'/proc/{pid}/environ'] + "
        "[f'/proc/{pid}/fd/{n}' for n in range(0, 12)]:\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDONLY))\n"
        "        print('opened', path)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    sb.write_file("probe.py", code)
    r = sb.run_shell("python3 probe.py")
    assert r.ok and "opened" not in r.stdout, r.stdout


def test_only_a_matching_seal_counts(sb) -> None:
    sb.write_file("/tmp/h.py", HARNESS)
    ok = run_sealed(sb, "python3 -I -B /tmp/h.py /tmp/payload seal", "/tmp/payload", 10)
    assert ok.verified and ok.payload == b"the payload" and "harness running" in ok.output()
    assert "FR-SEALED" not in ok.output()
    wrong = run_sealed(sb, "python3 -I -B /tmp/h.py /tmp/payload wrong-key", "/tmp/payload", 10)
    assert wrong.evidence == "forged" and wrong.payload is None
    none = run_sealed(sb, "python3 -I -B /tmp/h.py /tmp/payload exit", "/tmp/payload", 10)
    assert none.evidence == "missing" and none.result.exit_code == 0  # exit status 0 is not evidence


def test_verify_needs_the_payload_and_the_secret() -> None:
    mac = seal_of(b"k", b"p")
    assert verify(b"k", f"x\nFR-SEALED {mac}\n", b"p") == "sealed"
    assert verify(b"k", f"FR-SEALED {mac}", b"other") == "forged"
    assert verify(b"other", f"FR-SEALED {mac}", b"p") == "forged"
    assert verify(b"k", "all tests passed", b"p") == "missing"
