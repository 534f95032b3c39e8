"""The comparison report across checkpoints: ``results.json``, ``results.md`` and ``results.png``.

One row per checkpoint, and per bench the columns ``mean@k`` (avg@k: the mean reward of the k
samples, averaged over problems) and the unbiased ``pass@j`` for ``j`` in 1, 2, 4, ... k. The
bench's headline metric (``pass@k`` for code, ``mean@k`` otherwise) is marked in the header, and
with several checkpoints each later row shows its change against the first one. The plot has one
panel per bench: pass@j against j, one line per checkpoint (a bar chart of mean@k when k = 1).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fr_agents.eval.runner import BenchResult, report_ks

log = logging.getLogger(__name__)


def _ordered(values: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _columns(results: Sequence[BenchResult]) -> list[tuple[str, list[str]]]:
    """Per bench (in first-seen order): the metric names shown, headline first."""
    cols = []
    for bench in _ordered([r.bench for r in results]):
        first = next(r for r in results if r.bench == bench)
        passes = [f"pass@{j}" for j in report_ks(first.k)]
        names = (
            ["mean@k", *passes] if first.primary == "mean@k" else [f"pass@{first.k}", "mean@k", *passes[:-1]]
        )
        cols.append((bench, names))
    return cols


def render_markdown(results: Sequence[BenchResult]) -> str:
    """The comparison table as GitHub markdown (percentages, one decimal)."""
    if not results:
        raise ValueError("no results to report")
    labels = _ordered([r.label for r in results])
    by = {(r.label, r.bench): r for r in results}
    cols = _columns(results)
    header = ["checkpoint"]
    for bench, names in cols:
        r0 = next(r for r in results if r.bench == bench)
        for i, name in enumerate(names):
            shown = name.replace("@k", f"@{r0.k}")
            header.append(f"{bench} {'**' + shown + '**' if i == 0 else shown}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base = labels[0]
    for label in labels:
        cells = [label]
        for bench, names in cols:
            r = by.get((label, bench))
            for name in names:
                if r is None:
                    cells.append("–")
                    continue
                value = 100 * r.metrics[name]
                cell = f"{value:.1f}"
                b = by.get((base, bench))
                if label != base and b is not None:
                    cell += f" ({value - 100 * b.metrics[name]:+.1f})"
                cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for bench, _ in cols:
        r0 = next(r for r in results if r.bench == bench)
        temp = "greedy" if r0.temperature == 0 else f"temperature {r0.temperature:g}"
        desc = f" – {r0.description}" if r0.description else ""
        notes.append(f"- `{bench}`: {r0.tasks} problems × k={r0.k} samples, {temp}{desc}")
    return "\n".join(
        [
            "# Evaluation",
            "",
            *lines,
            "",
            "Values in %; in parentheses the change against the first checkpoint. mean@k is the mean reward "
            "over the k samples (avg@k); pass@j is the unbiased estimator 1 - C(n-c, j)/C(n, j).",
            "",
            *notes,
            "",
            *_group_tables(results, labels),
        ]
    )


def _group_tables(results: Sequence[BenchResult], labels: list[str]) -> list[str]:
    """Per bench whose items have groups (ALFWorld's task types): success % per group and checkpoint."""
    out: list[str] = []
    for bench in _ordered([r.bench for r in results]):
        rows = {r.label: r.extra.get("by_group") or {} for r in results if r.bench == bench}
        groups = _ordered([g for by in rows.values() for g in by])
        if not groups:
            continue
        shown = [label for label in labels if label in rows]
        out += [
            f"## {bench} by group (success %, tasks)",
            "",
            "| group | tasks | " + " | ".join(shown) + " |",
            "|" + "---|" * (len(shown) + 2),
        ]
        for g in groups:
            n = next(int(by[g]["tasks"]) for by in rows.values() if g in by)
            cells = [f"{100 * rows[label][g]['success']:.1f}" if g in rows[label] else "–" for label in shown]
            out.append(f"| {g} | {n} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def render_json(results: Sequence[BenchResult]) -> dict[str, Any]:
    """The report as one JSON-ready object."""
    return {
        "checkpoints": _ordered([r.label for r in results]),
        "benches": _ordered([r.bench for r in results]),
        "results": [r.as_dict() for r in results],
    }


def render_plot(results: Sequence[BenchResult], path: str | Path) -> Path:
    """Write the comparison figure (PNG) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = _ordered([r.bench for r in results])
    labels = _ordered([r.label for r in results])
    by = {(r.label, r.bench): r for r in results}
    fig, axes = plt.subplots(1, len(benches), figsize=(4.2 * len(benches), 3.4), squeeze=False)
    for ax, bench in zip(axes[0], benches, strict=True):
        rs = [by[(label, bench)] for label in labels if (label, bench) in by]
        if all(r.k == 1 for r in rs):
            ax.bar(range(len(rs)), [100 * r.metrics["mean@k"] for r in rs], color="tab:blue")
            ax.set_xticks(range(len(rs)), [r.label for r in rs], rotation=20, ha="right", fontsize=8)
            ax.set_ylabel("mean@1 (%)")
        else:
            for r in rs:
                ks = report_ks(r.k)
                label = f"{r.label} (mean@{r.k} {100 * r.metrics['mean@k']:.1f}%)"
                ax.plot(ks, [100 * r.metrics[f"pass@{j}"] for j in ks], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ks = report_ks(max(r.k for r in rs))
            ax.set_xticks(ks, [str(j) for j in ks])
            ax.set_xlabel("k")
            ax.set_ylabel("pass@k (%)")
            ax.legend(fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_title(bench, fontsize=10)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(results: Sequence[BenchResult], out_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and ``results.png`` into ``out_dir``; their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "plot": out / "results.png"}
    paths["json"].write_text(json.dumps(render_json(results), indent=2))
    paths["markdown"].write_text(render_markdown(results))
    render_plot(results, paths["plot"])
    return paths
