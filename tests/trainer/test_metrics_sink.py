"""MetricsSink: every row reaches metrics.jsonl and TensorBoard (read back with TensorBoard's own loader)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util.tensor_util import make_ndarray

from trainer.metrics import MetricsSink, read_metrics


def tb_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar in ``run_dir/tb`` as ``{tag: {step: value}}`` (the loader migrates a simple value
    into a scalar tensor, as TensorBoard reads it)."""
    out: dict[str, dict[int, float]] = {}
    for path in sorted((run_dir / "tb").iterdir()):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = float(make_ndarray(value.tensor))
    return out


def test_every_number_of_a_step_row_reaches_tensorboard_under_train_in_one_event(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, plot_every=1000, console=False)
    rows = [
        {
            "step": s,
            "reward": 0.25 * s,
            "acceptance": 1.0,
            "lag_max": s % 2,
            "packed": False,
            "lag_hist": {0: 3},
        }
        for s in (1, 2, 3)
    ]
    for row in rows:
        sink.step(row)
    sink.event("eval", step=3, success=0.5, bench="arithmetic")
    sink.close()
    scalars = tb_scalars(tmp_path)
    assert scalars["train/reward"] == {1: 0.25, 2: 0.5, 3: 0.75}
    assert scalars["train/acceptance"] == {1: 1.0, 2: 1.0, 3: 1.0}
    assert scalars["train/lag_max"] == {1: 1.0, 2: 0.0, 3: 1.0}
    assert scalars["eval/success"] == {3: 0.5}
    # bools, mappings and text are not scalars; the step is the event's step, not a value
    assert not any(t.endswith(("/packed", "/lag_hist", "/bench", "/step")) for t in scalars)
    events = [
        e for p in (tmp_path / "tb").iterdir() for e in EventFileLoader(str(p)).Load() if e.summary.value
    ]
    assert len(events) == 4  # one event per row
    assert [r["step"] for r in read_metrics(tmp_path) if r["kind"] == "step"] == [1, 2, 3]


def _drawn(png: Path) -> tuple:
    """curves.png's pixels."""
    import matplotlib.image as mpimg

    return tuple(mpimg.imread(png).ravel().tolist())


def test_curves_drawn_from_rows_kept_in_memory_equal_a_redraw_from_the_file(tmp_path: Path) -> None:
    """The sink keeps what curves.png draws as it writes rows (no re-read of metrics.jsonl per
    redraw): its drawing equals one made from the file alone, also after a resume truncated the
    file and reopened the sink."""
    from trainer.metrics import truncate_metrics

    live = tmp_path / "live"
    sink = MetricsSink(live, plot_every=2, console=False)
    for s in range(1, 7):
        sink.step({"step": s, "reward": 0.1 * s, "acceptance": 1.0 - 0.05 * s})
        if s == 4:
            sink.event("eval", step=4, success=0.4)
    assert sink._curves is not None and sink._curves.steps == [1, 2, 3, 4, 5, 6]  # drawn from memory
    assert sink._curves.eval_steps == [4] and sink._curves.eval_success == [0.4]
    fresh = MetricsSink(live, plot_every=1000, console=False)
    live_png = _drawn(live / "curves.png")
    fresh.plot()
    assert _drawn(live / "curves.png") == live_png
    truncate_metrics(live, 3)  # a resume from step 3 drops steps 4-6 and ...
    sink.reopen()
    assert sink._curves is None  # the file changed: the next redraw reads it again
    sink.step({"step": 4, "reward": 0.9, "acceptance": 0.5})  # ... recomputes step 4 (and redraws)
    assert sink._curves.steps == [1, 2, 3, 4] and sink._curves.reward[-1] == 0.9
    assert sink._curves.eval_steps == [4]  # the eval row is not a step row: truncation keeps it
