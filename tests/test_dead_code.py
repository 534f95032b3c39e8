"""No dead code in the packages: vulture finds nothing outside a short, reasoned allow-list.

Vulture reads the packages together with the tests and benchmarks (a name used only by a test
or a benchmark is used), and reports only what lies in the packages. Confidence 60 is its lowest
useful level: it catches unused functions, methods, attributes and dataclass fields, which is
where dead code hides here. Each allow-list entry is ``(path, name)`` with why it stays: a name
that a framework, a protocol or a dispatch table reads, which no static reader can see.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fr_agents", "trainer", "envs", "tools_sandbox")
READERS = ("tests", "benchmarks")  # code that uses names without being checked itself
MIN_CONFIDENCE = 60

ALLOWED: dict[tuple[str, str], str] = {
    # module-level __getattr__ (PEP 562): Python calls it for lazy attributes
    ("envs/alfworld/__init__.py", "__getattr__"): "PEP 562 lazy import",
    ("fr_agents/tree/__init__.py", "__getattr__"): "PEP 562 lazy import",
    ("trainer/elastic/__init__.py", "__getattr__"): "PEP 562 lazy import",
    # signatures fixed by a protocol: the argument must be there, unused or not
    ("envs/verify_worker.py", "signum"): "signal handler signature",
    ("envs/verifier.py", "memo"): "__deepcopy__ signature",
    ("fr_agents/spaces.py", "probability"): "gymnasium Space.sample signature",
    # read by a framework through its attribute protocol
    ("fr_agents/view/server.py", "protocol_version"): "http.server reads it",
    ("fr_agents/view/server.py", "log_message"): "http.server calls it",
    ("fr_agents/view/server.py", "do_GET"): "http.server dispatches GET to it",
    ("fr_agents/view/server.py", "daemon_threads"): "socketserver reads it",
    ("fr_agents/eval/engines.py", "pad_token"): "transformers tokenizer setting",
    ("fr_agents/models/resolve.py", "pad_token"): "transformers tokenizer setting",
    ("fr_agents/models/resolve.py", "hf_quantizer"): "transformers model setting",
    ("fr_agents/models/resolve.py", "is_quantized"): "transformers model setting",
    ("fr_agents/models/tiny.py", "pre_tokenizer"): "tokenizers setting",
    ("fr_agents/models/tiny.py", "chat_template"): "transformers tokenizer setting",
    ("fr_agents/models/tiny.py", "generation_config"): "transformers model setting",
    # dispatched by name
    ("envs/repo_coding/tools.py", "_bash"): "tool dispatch by name (getattr)",
    ("envs/repo_coding/tools.py", "_read_file"): "tool dispatch by name (getattr)",
    ("envs/repo_coding/tools.py", "_write_file"): "tool dispatch by name (getattr)",
    ("envs/repo_coding/tools.py", "_str_replace"): "tool dispatch by name (getattr)",
    ("envs/repo_coding/tools.py", "_run_tests"): "tool dispatch by name (getattr)",
    # record fields: written to disk / read from a dataset, part of a file format
    ("envs/repo_coding/task.py", "environment_setup_commit"): "SWE-style task record field",
    ("envs/repo_coding/task.py", "hints_text"): "SWE-style task record field",
    ("envs/repo_coding/task.py", "created_at"): "SWE-style task record field",
    ("envs/alfworld/generate.py", "walkthrough_len"): "manifest field of generated games",
    ("trainer/batches.py", "member"): "EpisodeSpec field, written to the ledger/metrics",
    (
        "trainer/elastic/simulator.py",
        "learner_busy_frac",
    ): "simulator report field (benchmarks read it from summary())",
    # public API kept on purpose (documented, exercised by hand)
    ("tools_sandbox/session.py", "restart"): "public session API",
    ("tools_sandbox/pool.py", "handed_out"): "pool statistic shown in repr/debugging",
    ("fr_agents/policy/vllm_engine.py", "_next_id"): "request id counter",
    ("fr_agents/tree/batch.py", "ideal_ratio"): "packing statistic for readers of a PackedBatch",
}

# (path, name pattern): whole families read the same way
ALLOWED_PATTERNS: dict[tuple[str, str], str] = {
    ("fr_agents/cli.py", r"_cmd_\w+"): "registered by the @command decorator, dispatched by argparse",
}

_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): (?P<what>.+?) '(?P<name>[^']+)' \((?P<conf>\d+)% confidence\)$"
)


def _findings() -> list[tuple[str, int, str, str]]:
    cmd = [sys.executable, "-m", "vulture", *PACKAGES, *READERS, f"--min-confidence={MIN_CONFIDENCE}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode not in (0, 3):  # 3: dead code found
        raise RuntimeError(f"vulture failed ({out.returncode}): {out.stderr[-2000:]}")
    found = []
    for line in out.stdout.splitlines():
        m = _LINE.match(line.strip())
        if m and m["path"].split("/")[0] in PACKAGES:
            found.append((m["path"], int(m["line"]), m["what"], m["name"]))
    return found


def test_no_dead_code_outside_the_allow_list() -> None:
    pytest.importorskip("vulture")
    found = _findings()

    def allowed(path: str, name: str) -> bool:
        return (path, name) in ALLOWED or any(
            path == p and re.fullmatch(pat, name) for p, pat in ALLOWED_PATTERNS
        )

    dead = [f"{p}:{n}: {w} {name!r}" for p, n, w, name in found if not allowed(p, name)]
    assert not dead, "dead code (remove it, or allow-list it with a reason):\n" + "\n".join(dead)
    stale = sorted({k for k in ALLOWED} - {(p, name) for p, _, _, name in found})
    assert not stale, f"allow-list entries vulture no longer reports (drop them): {stale}"
