"""What one training run did: :class:`TrainResult`, returned by every backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainResult:
    """What one ``fr-agents train`` run did."""

    ok: bool
    run_dir: Path
    steps: int
    stop_reason: str
    wall_s: float
    rl_s: float
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    last_checkpoint: Path | None = None

    def summary(self) -> str:
        lines = [f"run {self.run_dir}: {self.steps} steps, stopped: {self.stop_reason}, wall {self.wall_s:.0f}s (RL {self.rl_s:.0f}s)"]
        for name, ev in self.evals.items():
            per_episode = f", {ev['turns']:.1f} turns, {ev['tool_calls']:.1f} tool calls" if "turns" in ev else ""
            kept = f", the last good checkpoint (step {ev['checkpoint_step']})" if "checkpoint_step" in ev else ""
            lines.append(
                f"  held-out success {name}: {100 * ev['success']:.1f}% ({int(ev['episodes'])} tasks, "
                f"reward {ev['reward']:.3f}{per_episode}{kept})"
            )
        if self.last_checkpoint:
            lines.append(f"  last checkpoint: {self.last_checkpoint}")
        return "\n".join(lines)
