"""The run directory: what ``fr-agents train`` writes into ``RUN_DIR``, and how to read its ledger.

Every name below is declared here and nowhere else; the trainer (which writes these files) and the
viewer (which reads them) both import them from this module, so data still flows one way
(``fr_agents`` never imports ``trainer``)::

    RUN_DIR/
      config.yaml          CONFIG_FILE      the resolved config (names the model, hence the tokenizer)
      metrics.jsonl        METRICS_FILE     one JSON row per learner step, plus eval / warm_start / end events
      curves.png           PLOT_FILE        reward and acceptance against step, redrawn every plot_every steps
      tb/                  TENSORBOARD_DIR  the same rows as TensorBoard events
      store.sqlite         STORE_FILE       the trajectory tree (SQLite, WAL)
      episodes.sqlite      LEDGER_FILE      the episode ledger: which scheduled episode and batch
                                            each leaf served
      demos.sqlite         DEMO_STORE       the expert's warm-start episodes (warm_start.demos=expert)
      evals/               EVALS_DIR        held-out and periodic evaluations (samples, during_training.jsonl)
      checkpoints/         CHECKPOINT_DIR   step_NNNNNN/ folders, and LATEST naming the newest complete one
        step_000025/       checkpoint_name  HF weights + tokenizer + trainer_state.pt (STATE_FILE)

The episode ledger's tables, the queries that read them and the writer are :mod:`fr_agents.ledger`.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"
TENSORBOARD_DIR = "tb"
STORE_FILE = "store.sqlite"
LEDGER_FILE = "episodes.sqlite"
DEMO_STORE = "demos.sqlite"
EVALS_DIR = "evals"
DURING_TRAINING_FILE = "during_training.jsonl"  # inside EVALS_DIR: one summary row per periodic evaluation
CHECKPOINT_DIR = "checkpoints"
LATEST = "LATEST"  # inside CHECKPOINT_DIR: the name of the newest complete checkpoint
STATE_FILE = "trainer_state.pt"  # inside a checkpoint: what an exact resume needs besides the weights
CHECKPOINT_GLOB = "step_*"


# =========================================================================== checkpoints


def checkpoint_root(run_dir: str | Path) -> Path:
    """``RUN_DIR/checkpoints``."""
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint taken after ``step`` optimizer steps.

    >>> checkpoint_name(25)
    'step_000025'
    """
    return f"step_{step:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (the one ``LATEST`` names, else the newest
    folder holding a :data:`STATE_FILE`), or ``None``."""
    root = checkpoint_root(run_dir)
    pointer = root / LATEST
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / STATE_FILE).exists():
            return path
    done = sorted(p for p in root.glob(CHECKPOINT_GLOB) if (p / STATE_FILE).exists())
    return done[-1] if done else None
