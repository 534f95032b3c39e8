"""What a run writes while it trains: metrics.jsonl, TensorBoard events, a curves PNG, a progress line.

:class:`MetricsSink` receives one flat ``dict`` per learner step. Every row goes to
``metrics.jsonl`` (one JSON object a line, flushed at once so a crash loses nothing already
logged) and to TensorBoard (``RUN_DIR/tb``: one event per row holding all its numbers, each under
``train/<key>`` for steps and ``<kind>/<key>`` for other rows). Every ``plot_every`` steps
``curves.png`` is redrawn with the batch reward and the acceptance rate (the share of tokens whose
importance ratio lies inside the trust region), and the progress line is refreshed on the console.

The metrics row of one learner step: what the step trained on, what it cost, how stale it was.

:func:`step_row` is the ``step`` event :class:`~trainer.metrics.MetricsSink` writes after each
step (``metrics.jsonl``, the progress line, the plot); :func:`tree_metrics` is its part about the
batch's episode trees (leaves grown, merged, pruned, aborted, the sharing ratio).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fr_agents.ledger import LedgerRow
from fr_agents.run_layout import METRICS_FILE, PLOT_FILE, TENSORBOARD_DIR
from fr_agents.tree.batch import PackedBatch, TrainBatch, flat_view
from trainer.batches import BatchTrees

log = logging.getLogger(__name__)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line after a crash
                continue
    return rows


def truncate_metrics(run_dir: str | Path, last_step: int) -> None:
    """Keep only rows up to ``last_step`` (used on resume: later rows are recomputed)."""
    path = Path(run_dir) / METRICS_FILE
    rows = [r for r in read_metrics(run_dir) if r.get("kind") != "step" or r.get("step", 0) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.3f}" if math.isfinite(x) else str(x)
    return str(x)


class _Curves:
    """The series curves.png draws, from the rows of metrics.jsonl in order."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.reward: list[float] = []
        self.acceptance: list[float] = []
        self.eval_steps: list[int] = []
        self.eval_success: list[float] = []

    def add(self, row: dict[str, Any]) -> None:
        if row.get("kind") == "step":
            self.steps.append(row["step"])
            self.reward.append(row.get("reward", math.nan))
            self.acceptance.append(row.get("acceptance", math.nan))
        elif row.get("kind") == "eval":
            self.eval_steps.append(row["step"])
            self.eval_success.append(row["success"])


class MetricsSink:
    """Fan one metrics row out to jsonl, TensorBoard, the PNG and the console."""

    def __init__(
        self, run_dir: str | Path, *, plot_every: int = 100, log_every: int = 1, console: bool = True
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", buffering=1)  # noqa: SIM115 - held for the run
        self.plot_every = max(1, plot_every)
        self.log_every = max(1, log_every)
        # what curves.png draws, kept as rows are written (read from the file once, on the first
        # redraw after opening it): a redraw need not re-read a metrics.jsonl that grows all run
        self._curves: _Curves | None = None
        self._tb = None
        try:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard.writer import FileWriter

            self._summary = Summary
            self._tb = FileWriter(str(self.run_dir / TENSORBOARD_DIR))
        except Exception as e:  # noqa: BLE001 - TensorBoard is optional at run time
            log.warning("TensorBoard events disabled: %s", e)
        self._console = None
        if console:
            from rich.console import Console

            self._console = Console(stderr=True)

    def reopen(self) -> None:
        """Reopen metrics.jsonl (after :func:`truncate_metrics` replaced the file)."""
        self._file.close()
        self._file = open(self.run_dir / METRICS_FILE, "a", buffering=1)  # noqa: SIM115 - held for the run
        self._curves = None  # the file changed under us: read it again on the next redraw

    def event(self, kind: str, **fields: object) -> None:
        """A non-step row (warm start, evaluation, stop reason)."""
        row = {"kind": kind, **fields}
        self._file.write(json.dumps(row, default=float) + "\n")
        if self._curves is not None:
            self._curves.add(row)
        if "step" in fields:
            self._scalars(kind, fields, int(fields["step"]))

    def step(self, row: dict[str, Any]) -> None:
        row = {"kind": "step", **row}
        self._file.write(json.dumps(row, default=float) + "\n")
        if self._curves is not None:
            self._curves.add(row)
        step = int(row["step"])
        self._scalars("train", row, step)
        if self._console is not None and step % self.log_every == 0:
            self._console.print(self.progress_line(row), highlight=False)
        if step % self.plot_every == 0:
            self.plot()

    def _scalars(self, group: str, fields: dict[str, Any], step: int) -> None:
        """The numbers of one row as one TensorBoard event (one summary, one value per key: a step
        has ~40, and an event per value cost more than the rest of the row's logging)."""
        if self._tb is None:
            return
        values = [
            self._summary.Value(tag=f"{group}/{k}", simple_value=float(v))
            for k, v in fields.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        ]
        if values:
            self._tb.add_summary(self._summary(value=values), step)

    @staticmethod
    def progress_line(row: dict[str, Any]) -> str:
        parts = [
            f"step {row.get('step')}",
            f"reward {_fmt(row.get('reward', float('nan')))}",
            f"accept {_fmt(row.get('acceptance', float('nan')))}",
            f"tok/s {row.get('tokens_per_s', 0):.0f}",
            f"lag {row.get('lag_mean', 0):.1f} (max {row.get('lag_max', 0)})",
            f"loss {_fmt(row.get('loss', float('nan')))}",
        ]
        if row.get("leaves_per_tree", 1.0) != 1.0 or row.get("pruned") or row.get("partial_scored"):
            parts.append(
                f"tree {row.get('leaves_per_tree', 1.0):.1f} leaves (share "
                f"{row.get('sharing_ratio', 1.0):.2f}, pruned {int(row.get('pruned', 0))}, partial "
                f"{int(row.get('partial_scored', 0))}, trained reward "
                f"{_fmt(row.get('learner_reward', float('nan')))})"
            )
        if row.get("aborted"):  # grading could not happen: left out of the batch, not scored 0
            reasons = row.get("abort_reasons") or {}
            why = f": {', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))}" if reasons else ""
            parts.append(
                f"aborted {int(row['aborted'])} leaves{why}, "
                f"{int(row.get('aborted_episodes', 0))} episodes lost"
            )
        return " | ".join(parts)

    def plot(self) -> Path | None:
        """Redraw ``curves.png`` from metrics.jsonl (reward and acceptance against step)."""
        if self._curves is None:
            self._curves = _Curves()
            for row in read_metrics(self.run_dir):
                self._curves.add(row)
        c = self._curves
        if not c.steps:
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:  # pragma: no cover - matplotlib is a core dependency
            return None
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        axes[0].plot(c.steps, c.reward, label="batch reward")
        if c.eval_steps:
            axes[0].plot(c.eval_steps, c.eval_success, "o-", label="held-out success")
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("reward")
        axes[0].legend(loc="lower right")
        axes[1].plot(c.steps, c.acceptance, color="tab:green")
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("acceptance rate")
        axes[1].set_ylim(0, 1.02)
        fig.tight_layout()
        out = self.run_dir / PLOT_FILE
        tmp = self.run_dir / ".curves.tmp.png"
        fig.savefig(tmp, dpi=80)
        plt.close(fig)
        os.replace(tmp, out)
        return out

    def close(self) -> None:
        self.plot()
        self._file.close()
        if self._tb is not None:
            self._tb.close()


# =========================================================================== step row


def step_row(
    step: int,
    version: int,
    stats: dict[str, float],
    rows: Sequence[LedgerRow],
    lags: list[int],
    batch: TrainBatch | None,
    trees: BatchTrees,
    *,
    seconds: float,
    elapsed_s: float,
    sampled: int | None,
) -> dict[str, float]:
    """The row of the step that made ``version`` (``step``: steps done): the batch's mean env
    reward and tokens (from its ledger ``rows``), the learner's ``stats``, throughput over the
    ``seconds`` since the previous step, the policy lag of each trained row, the tree figures and,
    when the ledger knows it, ``sampled_tokens`` (the engine's count: identical siblings included)."""
    reward = float(sum(r[2] for r in rows) / len(rows)) if rows else float("nan")
    tokens = sum(r[3] for r in rows)
    row = {
        "step": step,
        "version": version,
        "reward": reward,
        "acceptance": stats.get("acceptance_rate", float("nan")),
        "loss": stats["loss"],
        "tokens": tokens,
        "tokens_per_s": tokens / max(1e-9, seconds),
        "lag_mean": sum(lags) / max(1, len(lags)),
        "lag_max": max(lags, default=0),
        "lag_hist": dict(collections.Counter(lags)),
        "elapsed_s": elapsed_s,
        **tree_metrics(batch, trees),
        **{k: v for k, v in stats.items() if k not in ("loss",)},
    }
    if sampled is not None:
        row["sampled_tokens"] = sampled
    return row


def tree_metrics(batch: TrainBatch | None, trees: BatchTrees) -> dict[str, float]:
    """The tree figures of one step: leaves grown per episode tree, leaves trained on (rows) and
    the sampled leaves they stand for (``samples``: merged identical siblings count each), leaves
    merged/pruned, leaves scored by partial progress, the mean reward of the leaves trained on as
    the learner saw it (``learner_reward``: the partial score of a cut leaf with
    ``rollout.reward: partial``, where the step's ``reward`` is the env's), and the batch's sharing
    ratio (logical tokens over the tokens a packed forward holds; 1.0 for a flat batch without
    sharing); ``aborted`` (leaves of the batch's episodes whose grading could not happen, every
    attempt counted; never trained on), ``aborted_episodes`` (episodes every attempt of which
    aborted) and, when there were any, ``abort_reasons`` (reason -> leaves)."""
    aborted = {"aborted": float(trees.aborted), "aborted_episodes": float(trees.aborted_episodes)}
    if trees.abort_reasons:
        aborted["abort_reasons"] = dict(trees.abort_reasons)  # type: ignore[assignment]
    if batch is None:  # nothing to train on: every episode aborted
        return {
            "leaves_per_tree": 0.0,
            "leaves": 0.0,
            "samples": 0.0,
            "merged": 0.0,
            "pruned": 0.0,
            "partial_scored": 0.0,
            "learner_reward": float("nan"),
            "sharing_ratio": 1.0,
            **aborted,
        }
    flat = flat_view(batch)
    logical = float(flat.lengths.sum())
    stored = float(batch.num_tokens) if isinstance(batch, PackedBatch) else logical
    return {
        "leaves_per_tree": trees.leaves_per_tree,
        "leaves": float(len(flat.leaf_ids)),
        "samples": float(trees.samples),
        "merged": float(trees.merged),
        "pruned": float(trees.merged + trees.capped),
        "partial_scored": float(trees.partial_scored),
        "learner_reward": float(flat.rewards.float().mean()) if len(flat.leaf_ids) else float("nan"),
        "sharing_ratio": logical / max(1.0, stored),
        **aborted,
    }
