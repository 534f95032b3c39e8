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
    rows = [{"step": s, "reward": 0.25 * s, "acceptance": 1.0, "lag_max": s % 2, "packed": False, "lag_hist": {0: 3}} for s in (1, 2, 3)]
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
    events = [e for p in (tmp_path / "tb").iterdir() for e in EventFileLoader(str(p)).Load() if e.summary.value]
    assert len(events) == 4  # one event per row
    assert [r["step"] for r in read_metrics(tmp_path) if r["kind"] == "step"] == [1, 2, 3]
