"""``trainer.backend=process``: the rollout runs in a child process of its own, reports failures
with their traceback, refuses hooks that act inside it, and leaves nothing running."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch

from fr_agents.config import ConfigError, load_config
from tests.trainer.test_loop import BASE as LOOP_BASE
from trainer.loop import Trainer, TrainerHooks

BASE = [*LOOP_BASE, "trainer.backend=process"]


def test_the_rollout_runs_in_a_child_process_that_ends_with_the_run(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=3", "rollout.max_policy_lag=1"])
    t = Trainer(cfg, tmp_path, console=False)
    res = t.run()
    assert res.ok and res.steps == 3
    child = t.rollout_process._proc
    assert child.pid != os.getpid() and child.exitcode == 0 and not child.is_alive()
    assert t.runner.engine is None, "the learner's process samples nothing itself"
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (start,) = [r for r in rows if r["kind"] == "start"]
    assert start["backend"] == "process" and start["engine"] == "hf (rollout process)"
    (ready,) = [r for r in rows if r["kind"] == "rollout"]
    assert ready["engine"] == "HFEngine" and ready["pid"] == child.pid
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["leaves"] for r in steps] == [8.0, 8.0, 8.0] and [r["lag_max"] for r in steps] == [0, 1, 1]


def test_a_run_with_no_rl_steps_sends_the_child_no_weights_and_ends_cleanly(tmp_path: Path, capfd) -> None:
    """``trainer.steps=0`` (a warm start only): the child is spawned with the run, but has no batch
    to roll out. Weights handed to it would be torn down mid-transfer by its stop (a traceback of
    multiprocessing's resource sharer in the learner's stderr, every time, before the fix)."""
    torch.set_num_threads(1)
    cfg = load_config("math-tiny", [*BASE, "trainer.steps=0"])
    t = Trainer(cfg, tmp_path, console=False)
    res = t.run()
    assert res.ok and res.steps == 0
    child = t.rollout_process._proc
    assert child.exitcode == 0 and not child.is_alive()
    assert t.board._listeners == [], "the board's versions were never forwarded to the child"
    assert "Traceback" not in capfd.readouterr().err


FAILING_ENV = '''
import gymnasium
from fr_agents.spaces import AnyText

class StepFails(gymnasium.Env):
    """Resets like a task env; every step raises (a real failure inside the rollout)."""

    def __init__(self, **kwargs):
        self.observation_space, self.action_space = AnyText(4096), AnyText(4096)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "What is 1 + 1?", {}

    def step(self, action):
        raise ValueError("step exploded on purpose")

if "fr_agents_test/StepFails-v0" not in gymnasium.registry:
    gymnasium.register(id="fr_agents_test/StepFails-v0", entry_point=f"{__name__}:StepFails")
'''


def test_a_failure_in_the_rollout_process_stops_the_run_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "step_fails_env.py").write_text(textwrap.dedent(FAILING_ENV))
    monkeypatch.syspath_prepend(str(mods))  # the spawned child gets the parent's sys.path
    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny", [*BASE, "trainer.steps=3", "env.id=step_fails_env:fr_agents_test/StepFails-v0"]
    )
    t = Trainer(cfg, tmp_path / "run", console=False)
    with pytest.raises(RuntimeError, match="rollout failed") as e:
        t.run()
    text = str(e.value)
    assert "step exploded on purpose" in text and "Traceback" in text  # the child's own traceback
    child = t.rollout_process._proc
    child.join(30)
    assert not child.is_alive()


def test_hooks_that_act_inside_the_rollout_need_the_local_backend(tmp_path: Path) -> None:
    class Counting(TrainerHooks):
        def episode_done(self, outcome):
            pass

    cfg = load_config("math-tiny", BASE)
    with pytest.raises(ConfigError, match=r"trainer.backend: .*Counting.episode_done.*trainer.backend=local"):
        Trainer(cfg, tmp_path, console=False, hooks=Counting())
    assert Trainer(cfg, tmp_path, console=False, hooks=TrainerHooks()) is not None  # no-op hooks are fine
    local = load_config("math-tiny", [*BASE, "trainer.backend=local"])
    assert Trainer(local, tmp_path, console=False, hooks=Counting()) is not None
