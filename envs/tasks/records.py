"""Turn dataset records shaped like GSM8K, MATH or plain prompt/answer into :class:`Task` dicts.

* GSM8K: ``{"question": ..., "answer": "... reasoning ...\\n#### 1,234"}`` -> answer ``"1234"``;
* MATH: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}} ..."}`` -> answer ``"\\frac{1}{2}"``
  (the last box of the solution; an explicit ``"answer"`` field wins when present);
* plain: ``{"prompt": ..., "answer": ...}``.

``fmt="auto"`` picks by the keys present. Shared by the JSONL and HF ``datasets`` sources.
"""

from __future__ import annotations

from typing import Any

from envs.answer_extract import last_boxed
from envs.tasks.base import Task, make_task
from fr_agents.config import ConfigError

RECORD_FORMATS = ("auto", "gsm8k", "math", "plain")


def gsm8k_answer(text: str) -> str | None:
    """The number after the last ``####`` with thousands separators removed (None if missing)."""
    if "####" not in text:
        return None
    ans = text.rsplit("####", 1)[1].strip().replace(",", "")
    return ans.rstrip(".") or None


def detect_format(rec: dict[str, Any]) -> str:
    if "question" in rec and "answer" in rec and isinstance(rec["answer"], str) and "####" in rec["answer"]:
        return "gsm8k"
    if "problem" in rec and ("solution" in rec or "answer" in rec):
        return "math"
    if "prompt" in rec and "answer" in rec:
        return "plain"
    if "question" in rec and "answer" in rec:
        return "plain"
    raise ConfigError(
        f"tasks.params.format: cannot tell the record format from keys {sorted(rec)}; "
        "expected question/answer('#### n'), problem/solution(\\boxed) or prompt/answer"
    )


def record_to_task(rec: dict[str, Any], task_id: str, fmt: str = "auto", **metadata: Any) -> Task | None:
    """One record as a Task; None when the record has no extractable gold answer."""
    if fmt not in RECORD_FORMATS:
        raise ConfigError(f"tasks.params.format: expected one of {', '.join(RECORD_FORMATS)}, got {fmt!r}")
    kind = detect_format(rec) if fmt == "auto" else fmt
    tid = str(rec.get("id", rec.get("unique_id", task_id)))
    try:
        if kind == "gsm8k":
            prompt, answer = rec["question"], gsm8k_answer(str(rec["answer"]))
        elif kind == "math":
            prompt = rec["problem"]
            answer = (
                str(rec["answer"])
                if rec.get("answer") not in (None, "")
                else last_boxed(str(rec.get("solution", "")))
            )
        else:
            prompt, answer = rec.get("prompt", rec.get("question")), rec["answer"]
            answer = None if answer is None else str(answer)
    except KeyError as e:
        raise ConfigError(
            f"tasks.params.format: record {tid} has no field {e} required by format '{kind}'"
        ) from e
    if not answer or prompt is None:
        return None
    extra = {k: v for k, v in rec.items() if k in ("level", "type", "subject", "category")}
    return make_task(tid, str(prompt), answer, format=kind, **extra, **metadata)
