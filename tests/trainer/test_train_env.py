"""``fr-agents train --env MODULE:ID``: a user's env, defined outside the package, trains from one
command; a bad id, a constructor that raises and a first reset that fails are config errors
before anything starts, carrying the env's own message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GUESS_ENV = '''
"""A user's env, outside fr-agents: guess a digit in up to 4 turns, told higher/lower."""
import gymnasium

from fr_agents.spaces import AnyText


class GuessEnv(gymnasium.Env):
    def __init__(self, fail_reset=False):
        self.observation_space, self.action_space = AnyText(), AnyText()
        self.fail_reset = fail_reset

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_reset:
            raise RuntimeError("guess: the secrets file is missing")
        if options and "task" in options:
            raise ValueError("guess: this env picks its own tasks (no options['task'])")
        self.secret = int(self.np_random.integers(10))
        return "Guess my digit (0-9).", {}

    def step(self, action):
        digits = [int(c) for c in action if c.isdigit()]
        if digits and digits[-1] == self.secret:
            return "Right!", 1.0, True, False, {"won": True}
        hint = "higher" if digits and digits[-1] < self.secret else "lower"
        return f"No, {hint}.", 0.0, False, False, {"won": False}


gymnasium.register(id="me/Guess-v0", entry_point=GuessEnv)
'''

SMALL = [
    "model.tiny_size=nano",
    "trainer.steps=2",
    "trainer.batch_size=4",
    "rollout.concurrency=4",
    "rollout.max_new_tokens=4",
    "rollout.max_context=128",
    "trainer.eval_episodes=4",  # held-out episodes are reset by seed too (the env refuses options["task"])
]


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "guessmod.py").write_text(textwrap.dedent(GUESS_ENV))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )
    return subprocess.run(
        [sys.executable, "-m", "fr_agents.cli", "train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_train_on_a_user_env_from_one_command(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = _train(tmp_path, "--env", "guessmod:me/Guess-v0", *SMALL, "--run-dir", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = (run / "config.yaml").read_text()
    assert "id: guessmod:me/Guess-v0" in cfg and "source: env-reset" in cfg and "max_turns: 4" in cfg
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2]
    evals = {r["name"]: r for r in rows if r["kind"] == "eval"}
    assert set(evals) == {"before", "after_rl"} and evals["before"]["episodes"] == 4
    from fr_agents.tree import TrajectoryTree

    tree = TrajectoryTree.open(run / "store.sqlite")
    try:
        assert tree.stats()["leaves"] >= 8
    finally:
        tree.close()


def test_dry_run_of_env_shows_the_user_env(tmp_path: Path) -> None:
    r = _train(tmp_path, "--env", "guessmod:me/Guess-v0", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "id: guessmod:me/Guess-v0" in r.stdout and "source: env-reset" in r.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--env", "guessmod:me/Nope-v0"], "'me/Nope-v0' is not registered"),
        (
            ["--env", "guessmod:me/Guess-v0", "env.kwargs={colour: red}"],
            "env.kwargs: gymnasium.make('guessmod:me/Guess-v0', **{'colour': 'red'}) failed: TypeError",
        ),
        (
            ["--env", "guessmod:me/Guess-v0", "env.kwargs={fail_reset: true}"],
            "the first reset() of guessmod:me/Guess-v0 (seed 0) failed: "
            "RuntimeError: guess: the secrets file is missing",
        ),
        (
            ["math-tiny", "env.id=guessmod:me/Guess-v0"],  # the preset's kwargs reach the user's env
            "unexpected keyword argument 'answer_format'",
        ),
        (
            [
                "math-tiny",
                "env.id=guessmod:me/Guess-v0",
                "env.kwargs={}",
            ],  # replaced, but the env refuses tasks
            "guess: this env picks its own tasks",
        ),
    ],
)
def test_env_problems_are_config_errors_before_anything_starts(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    run = tmp_path / "run"
    r = _train(tmp_path, *args, *SMALL, "--run-dir", str(run))
    assert r.returncode == 2, (r.stdout[-1000:], r.stderr[-2000:])
    assert "config error" in r.stderr and expected in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not run.exists(), "nothing may start before the checks pass"
