"""The run page's data: metrics curves, the config text, checkpoints.

``metrics.jsonl`` is appended by the trainer one line per learner step (``kind: step``) and one
per event (``eval``, ``eval_at_k``, ``warm_start``, ``stop``, ``end``). It is read as it grows:
a torn last line (the writer is mid-line) is skipped until it is complete.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

# step-row columns drawn as curves (label, key); held-out success comes from eval rows
STEP_SERIES = (
    ("batch reward", "reward"),
    ("trust-gate acceptance", "acceptance"),
    ("tokens/s", "tokens_per_s"),
    ("policy lag (mean)", "lag_mean"),
    ("loss", "loss"),
)


def read_rows(path: Path | None) -> list[dict[str, Any]]:
    """Every complete JSON row of ``metrics.jsonl`` (none when the file is missing)."""
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def curves(rows: list[dict[str, Any]], sharing: list[dict[str, Any]]) -> dict[str, Any]:
    """Series for the run page. ``sharing`` is :meth:`StoreReader.sharing_by_batch`."""
    steps = [r for r in rows if r.get("kind") == "step" and _num(r.get("step")) is not None]
    series = {
        key: {"label": label, "x": [r["step"] for r in steps], "y": [_num(r.get(key)) for r in steps]}
        for label, key in STEP_SERIES
    }
    evals = [r for r in rows if r.get("kind") == "eval" and _num(r.get("success")) is not None]
    series["success"] = {
        "label": "held-out success",
        "x": [r.get("step", 0) for r in evals],
        "y": [_num(r.get("success")) for r in evals],
        "names": [str(r.get("name", "")) for r in evals],
    }
    at_k = [r for r in rows if r.get("kind") == "eval_at_k"]
    if at_k:
        # the periodic eval's row names its metrics avg@k / pass@k (fr_agents/eval/periodic.py)
        key = next(
            (k for k in at_k[0] if k.startswith(("avg@", "pass@")) and _num(at_k[0][k]) is not None), None
        )
        if key:
            series["success_at_k"] = {
                "label": f"periodic eval ({key})",
                "x": [r.get("step", 0) for r in at_k],
                "y": [_num(r.get(key)) for r in at_k],
            }
    series["sharing"] = {
        "label": "sharing ratio (logical / stored tokens per consumed batch)",
        "x": [s["batch"] for s in sharing],
        "y": [s["ratio"] for s in sharing],
    }
    lag: Counter[int] = Counter()
    for r in steps:
        for k, v in (r.get("lag_hist") or {}).items():
            try:
                lag[int(k)] += int(v)
            except (TypeError, ValueError):
                continue
    events = [
        {k: v for k, v in r.items() if k != "lag_histogram"}
        for r in rows
        if r.get("kind") in ("warm_start", "stop", "end")
    ]
    last = steps[-1] if steps else {}
    return {
        "steps": len(steps),
        "last": {k: v for k, v in last.items() if not isinstance(v, (dict, list))},
        "series": series,
        "lag_hist": sorted(lag.items()),
        "events": events,
    }


def config_text(path: Path | None) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path is not None and path.is_file() else None
