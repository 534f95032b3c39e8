"""`fr-agents play fr_agents/ALFWorld-v0 --human` driven through stdin, and `--agent expert`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.alfworld.generate import find_games

pytestmark = pytest.mark.alfworld
ROOT = Path(__file__).resolve().parents[3]


def _play(args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fr_agents.cli", "play", "fr_agents/ALFWorld-v0", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


def test_play_human_through_stdin(games_root: str) -> None:
    game = next(g for g in find_games(games_root, "valid_seen") if "pick_and_place_simple" in g)
    walkthrough = json.loads(Path(game).read_text())["walkthrough"]
    kwargs = json.dumps({"game_files": [game]})
    # A typo first (the engine answers "Nothing happens." plus a hint), then the walkthrough.
    out = _play(
        ["--human", "--max-turns", "50", "--env-kwargs", kwargs],
        "fly to the moon\n" + "\n".join(walkthrough) + "\n",
    )
    assert out.returncode == 0, out.stderr
    assert "Your task is to:" in out.stdout and "Nothing happens." in out.stdout
    assert "[result] finished, total reward 1.0, partial_score 1.0" in out.stdout


def test_play_agent_expert(games_root: str) -> None:
    kwargs = json.dumps({"games_dir": games_root, "split": "valid_unseen"})
    out = _play(["--agent", "expert", "--max-turns", "50", "--seed", "2", "--env-kwargs", kwargs])
    assert out.returncode == 0, out.stderr
    assert "[result] won=True, partial_score 1.0" in out.stdout


def test_play_a_run_plays_its_checkpoint_as_it_trained(games_root: str, tmp_path: Path) -> None:
    """`--model RUN`: the run's latest checkpoint, its system prompt, env kwargs and limits."""
    from fr_agents.config import load_config
    from fr_agents.config_io import dump_config
    from fr_agents.models.resolve import load_policy
    from fr_agents.run_layout import STATE_FILE

    game = next(g for g in find_games(games_root, "valid_seen") if "pick_and_place_simple" in g)
    cfg = load_config(
        "alfworld-tiny",
        [
            f"env.kwargs={{list_admissible: false, game_files: [{game}]}}",
            "env.max_turns=2",
            "env.system_prompt=You are a careful robot.",
            "rollout.max_new_tokens=5",
        ],
    )
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000003"
    model, tok = load_policy("tiny")
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    (ckpt / STATE_FILE).write_text("{}")
    dump_config(cfg, run / "config.yaml")
    out = _play(["--model", str(run)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[model turn") == 2  # the run's two turns, not the default's
    assert "Admissible commands" not in out.stdout  # the run's env kwargs
    bad = subprocess.run(
        [sys.executable, "-m", "fr_agents.cli", "play", "fr_agents/MathVerifier-v0", "--model", str(run)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert bad.returncode != 0 and "the run trained on fr_agents/ALFWorld-v0" in bad.stderr
