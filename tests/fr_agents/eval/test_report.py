"""The comparison report: markdown table content, JSON, and a real non-empty PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fr_agents.eval.report import render_markdown, write_report
from fr_agents.eval.runner import BenchResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(
    label: str, bench: str, k: int, mean: float, passes: dict[int, float], primary: str = "mean@k"
) -> BenchResult:
    metrics = {"mean@k": mean, "success": mean, **{f"pass@{j}": v for j, v in passes.items()}}
    return BenchResult(
        label=label,
        bench=bench,
        primary=primary,
        k=k,
        temperature=1.0,
        tasks=10,
        samples=10 * k,
        metrics=metrics,
        seconds=1.0,
        description=f"{bench} test",
    )


@pytest.fixture
def two_checkpoints() -> list[BenchResult]:
    return [
        result("before", "arithmetic", 4, 0.10, {1: 0.10, 2: 0.18, 4: 0.30}),
        result("before", "humaneval", 4, 0.0, {1: 0.0, 2: 0.0, 4: 0.0}, primary="pass@k"),
        result("after", "arithmetic", 4, 0.625, {1: 0.625, 2: 0.75, 4: 0.9}),
        result("after", "humaneval", 4, 0.05, {1: 0.05, 2: 0.08, 4: 0.1}, primary="pass@k"),
    ]


def test_markdown_table_has_a_row_per_checkpoint_headline_first_and_deltas(
    two_checkpoints: list[BenchResult],
) -> None:
    md = render_markdown(two_checkpoints)
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| checkpoint"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:5] == [
        "checkpoint",
        "arithmetic **mean@4**",
        "arithmetic pass@1",
        "arithmetic pass@2",
        "arithmetic pass@4",
    ]
    assert cols[5] == "humaneval **pass@4**"  # code benches lead with pass@k
    before = next(line for line in lines if line.startswith("| before"))
    after = next(line for line in lines if line.startswith("| after"))
    assert "| 10.0 |" in before and "(+" not in before
    assert "62.5 (+52.5)" in after  # arithmetic mean@4, against the first checkpoint
    assert "10.0 (+10.0)" in after  # humaneval pass@4
    assert "`humaneval`: 10 problems × k=4 samples, temperature 1" in md


def test_write_report_writes_json_markdown_and_a_non_empty_png(
    tmp_path: Path, two_checkpoints: list[BenchResult]
) -> None:
    paths = write_report(two_checkpoints, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data["checkpoints"] == ["before", "after"]
    assert data["benches"] == ["arithmetic", "humaneval"]
    after = next(r for r in data["results"] if r["label"] == "after" and r["bench"] == "arithmetic")
    assert after["metrics"]["pass@4"] == 0.9
    assert paths["markdown"].read_text() == render_markdown(two_checkpoints)
    png = paths["plot"].read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000


def test_k1_results_plot_as_bars_and_missing_cells_show_a_dash(tmp_path: Path) -> None:
    results = [
        result("a", "arithmetic", 1, 0.2, {1: 0.2}),
        result("b", "arithmetic", 1, 0.4, {1: 0.4}),
        result("b", "champ", 1, 0.1, {1: 0.1}),
    ]
    paths = write_report(results, tmp_path)
    assert paths["plot"].read_bytes().startswith(PNG_MAGIC)
    row_a = next(line for line in render_markdown(results).splitlines() if line.startswith("| a "))
    assert row_a.rstrip().endswith("| – | – |")


def test_empty_report_is_an_error() -> None:
    with pytest.raises(ValueError, match="no results"):
        render_markdown([])
