"""What ``fr-agents view PATH`` is looking at: a run directory or a bare tree store file.

A run directory (written by ``fr-agents train``) holds the config, ``metrics.jsonl``, the store,
the episode ledger and the checkpoints; their names are declared once, in
:mod:`fr_agents.run_layout`, which the trainer writes them with and this module reads them with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fr_agents.run_layout import (
    CHECKPOINT_DIR,
    CHECKPOINT_GLOB,
    CONFIG_FILE,
    LATEST,
    LEDGER_FILE,
    METRICS_FILE,
    STATE_FILE,
    STORE_FILE,
    checkpoint_root,
)


@dataclass(frozen=True)
class Target:
    """The files behind one view: ``run_dir`` is None for a bare store file."""

    store: Path
    run_dir: Path | None

    @property
    def kind(self) -> str:
        return "run" if self.run_dir is not None else "store"

    @property
    def ledger(self) -> Path | None:
        p = self.run_dir / LEDGER_FILE if self.run_dir else None
        return p if p is not None and p.is_file() else None

    @property
    def metrics(self) -> Path | None:
        return self.run_dir / METRICS_FILE if self.run_dir else None

    @property
    def config(self) -> Path | None:
        return self.run_dir / CONFIG_FILE if self.run_dir else None


def locate(path: str | Path) -> Target:
    """Resolve ``PATH``: a run directory, a store file inside one, or a bare store file.

    Raises ``ValueError`` naming ``PATH`` when it is neither.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        store = p / STORE_FILE
        if not store.is_file() and not (p / CONFIG_FILE).is_file():
            raise ValueError(
                f"PATH: {p} is a directory without {STORE_FILE} or {CONFIG_FILE} (not a run directory)"
            )
        return Target(store=store, run_dir=p)
    if p.is_file():
        parent = p.parent
        if p.name == STORE_FILE and (parent / CONFIG_FILE).is_file():
            return Target(store=p, run_dir=parent)
        return Target(store=p, run_dir=None)
    raise ValueError(f"PATH: {p} does not exist (give a run directory or a trajectory store file)")


def checkpoints(run_dir: Path | None) -> list[dict[str, Any]]:
    """The run's checkpoints, oldest first: name, step, complete, bytes, mtime, latest."""
    if run_dir is None:
        return []
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    latest_file = root / LATEST
    latest = latest_file.read_text().strip() if latest_file.is_file() else ""
    out = []
    for d in sorted(root.glob(CHECKPOINT_GLOB)):
        if not d.is_dir():
            continue
        files = [f for f in d.rglob("*") if f.is_file()]
        try:
            step = int(d.name.removeprefix("step_"))
        except ValueError:
            continue
        out.append(
            {
                "name": d.name,
                "step": step,
                "complete": (d / STATE_FILE).is_file(),
                "bytes": sum(f.stat().st_size for f in files),
                "mtime": d.stat().st_mtime,
                "latest": d.name == latest,
            }
        )
    return out


def tokenizer_source(target: Target, model: str | None) -> str:
    """Where to load the tokenizer from: ``model`` when given, else the run's latest checkpoint
    (it holds the tokenizer files), else the model its config names, else ``tiny``.

    A bare store file does not record which tokenizer wrote it: pass the ``--model`` used then.
    """
    from fr_agents.models import resolve_model, tiny_dir

    if model:
        return str(resolve_model(model))
    if target.run_dir is not None:
        for ck in reversed(checkpoints(target.run_dir)):
            d = target.run_dir / CHECKPOINT_DIR / ck["name"]
            if (d / "tokenizer_config.json").is_file():
                return str(d)
        cfg_path = target.config
        if cfg_path is not None and cfg_path.is_file():
            import yaml

            cfg = yaml.safe_load(cfg_path.read_text()) or {}
            m = cfg.get("model") or {}
            name = str(m.get("name", "tiny"))
            if name == "tiny":
                return str(tiny_dir(str(m.get("tiny_size", "micro")), int(m.get("tiny_seed", 0))))
            if name.startswith("tiny-"):
                return str(tiny_dir(name.removeprefix("tiny-"), int(m.get("tiny_seed", 0))))
            return str(resolve_model(name))
    return str(resolve_model("tiny"))
