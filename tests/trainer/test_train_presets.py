"""Every preset validates and dry-runs (its exit code is the real run's verdict); every ``*-tiny``
preset trains to its end for real; bad input fails early with the culprit named."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from fr_agents.cli import main
from fr_agents.config import ConfigError, list_presets, load_config
from trainer.checkpoint import latest_checkpoint
from trainer.preflight import check_env, check_model, run_preflight


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_dry_runs(preset: str, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    rc = main(["train", preset, "--dry-run", f"run.out_dir={tmp_path}"])
    out = capsys.readouterr().out
    would_start = run_preflight(load_config(preset), import_env=False).ok
    assert rc == (0 if would_start else 2), "the dry run's exit code is the real run's verdict"
    assert ("the real run would refuse to start" in out) == (not would_start)
    if preset.endswith("-tiny"):
        assert rc == 0, f"{preset}: every CPU preset must be able to start here"
    assert "# resolved config" in out and "# placement plan" in out
    assert "nothing was started" in out
    assert f"preset: {preset}" in out
    assert not any(tmp_path.iterdir()), "a dry run must not create the run directory"


@pytest.mark.parametrize("reward", ["env", "partial", "progress"])
def test_the_dry_run_says_how_a_cut_episode_is_paid_and_credited(
    reward: str, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """The plan names ``rollout.reward``'s rule, and under ``progress`` the credit line says that a cut
    row's replies after its last progress earn 0 (not "on all its tokens", the batch baseline's rule)."""
    assert (
        main(["train", "math-tiny", f"rollout.reward={reward}", "--dry-run", f"run.out_dir={tmp_path}"]) == 0
    )
    plan = capsys.readouterr().out.split("# placement plan")[1]
    assert f"(rollout.reward={reward})" in plan
    on_all = (
        "credit: objective.baseline=batch: each row's reward minus the batch's mean reward, on all its tokens"
    )
    assert (on_all in plan) == (reward != "progress")
    assert ("the replies after it count as earning 0" in plan) == (reward == "progress")


def test_dry_run_that_would_refuse_exits_nonzero(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    for override in ("model.name=/nonexistent/model", "tasks.source=no-such-source"):
        rc = main(["train", "math-tiny", override, "--dry-run", f"run.out_dir={tmp_path}"])
        out = capsys.readouterr().out
        assert rc == 2, override
        assert "UNAVAILABLE" in out and "the real run would refuse to start" in out
    assert not any(tmp_path.iterdir())


def test_gpu_presets_mirror_the_paper() -> None:
    math = load_config("math-qwen2.5-math-1.5b")
    assert (math.model.name, math.objective.delta, math.trainer.batch_size) == (
        "Qwen/Qwen2.5-Math-1.5B",
        3e-3,
        128,
    )
    tool = load_config("python-tool-qwen2.5-7b")
    assert (tool.env.max_turns, tool.objective.delta, tool.trainer.batch_size) == (10, 1e-3, 128)
    alf = load_config("alfworld-qwen2.5-7b")
    assert (alf.env.max_turns, alf.trainer.batch_size, alf.objective.delta) == (50, 64, 1e-3)
    assert "R1-Distill" in load_config("math-r1-distill-1.5b").model.name
    for name in (
        "math-qwen2.5-math-1.5b",
        "python-tool-qwen2.5-7b",
        "alfworld-qwen2.5-7b",
        "math-r1-distill-1.5b",
    ):
        cfg = load_config(name)
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.rollout.temperature, cfg.rollout.top_p) == (
            1e-6,
            0.1,
            1.0,
            1.0,
        )


def test_ablation_switches_are_config_keys(capsys: pytest.CaptureFixture[str]) -> None:
    for override in (
        "objective.delta=inf",
        "objective.importance_sampling=false",
        "objective.aggregation=token_mean",
        "objective.algo=grpo",
    ):
        assert main(["train", "math-tiny", override, "--dry-run"]) == 0
    assert "GRPO groups of 4" in capsys.readouterr().out


def test_invalid_key_is_named_before_anything_starts(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    rc = main(["train", "math-tiny", "trainer.batch_sise=8", f"run.out_dir={tmp_path}"])
    assert rc == 2
    assert "trainer.batch_sise" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_missing_model_and_env_fail_preflight(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    cfg = load_config("math-tiny", ["model.name=/nonexistent/model", "env.id=fr_agents/NoSuchEnv-v0"])
    assert not check_model(cfg).ok
    env = check_env(cfg)
    assert not env.ok and "NoSuchEnv" in env.detail
    with pytest.raises(ConfigError, match=r"model\.name.*env\.id"):
        run_preflight(cfg).raise_if_failed()
    rc = main(["train", "math-tiny", "model.name=/nonexistent/model", f"run.out_dir={tmp_path}"])
    assert rc == 2 and "model.name" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert not check_env(load_config("math-tiny", ["env.id=not an id"])).ok
    assert check_env(load_config("math-tiny")).ok


def test_elastic_dry_run_states_the_pools(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    args = [
        "train",
        "math-tiny",
        "trainer.elastic=true",
        "trainer.backend=local",
        "trainer.devices=4",
        "trainer.rollout_devices=3",
    ]
    assert main([*args, "--dry-run", f"run.out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "pools: 4 CPU slots, 3 rollout / 1 train at the start" in out
    assert "one torch thread per train slot" in out
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- real runs


def _events(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == kind]


def test_multi_turn_run_writes_held_out_figures_before_and_after(tmp_path: Path) -> None:
    """env.max_turns != 1 no longer skips the held-out evaluation: before and after RL, through the
    eval runner, with success, mean reward, turns and tool calls per episode."""
    torch.set_num_threads(1)
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "math-tiny",
            "env.max_turns=3",
            "model.tiny_size=nano",
            "trainer.steps=2",
            "trainer.batch_size=4",
            "rollout.concurrency=4",
            "warm_start.examples=0",
            "trainer.eval_episodes=6",
            "trainer.checkpoint_every=0",
            "--run-dir",
            str(run),
        ]
    )
    assert rc == 0
    evals = {e["name"]: e for e in _events(run, "eval")}
    assert set(evals) == {"before", "after_rl"}
    for e in evals.values():
        assert e["episodes"] == 6
        assert {"success", "reward", "turns", "tool_calls", "seconds"} <= set(e)
        assert e["turns"] >= 1
    assert evals["after_rl"]["step"] == 2
    samples = run / "evals" / "samples" / "after_rl_step000002" / "preset_math-tiny.jsonl"
    assert len(samples.read_text().splitlines()) == 6


def _sandbox_backend() -> str | None:
    from tools_sandbox.bwrap import bwrap_available
    from tools_sandbox.docker_backend import docker_available

    return next(
        (name for name, probe in (("docker", docker_available), ("bwrap", bwrap_available)) if probe()[0]),
        None,
    )


def _needs_sandbox() -> None:
    if _sandbox_backend() is None:
        pytest.skip("needs a sandbox backend (a running Docker daemon with the image, or bubblewrap)")


def _needs_alfworld() -> None:
    pytest.importorskip("alfworld", reason="needs the alfworld extra: bash scripts/install_alfworld.sh")
    pytest.importorskip(
        "fast_downward", reason="needs fast-downward-textworld: bash scripts/install_alfworld.sh"
    )


# What each CPU preset needs beyond the core install, and overrides that keep its real run short.
_TINY_RUNS = {
    "math-tiny": (
        (),
        None,
        [
            "warm_start.examples=32",
            "warm_start.epochs=1",
            "trainer.batch_size=8",
            "rollout.concurrency=8",
            "trainer.eval_episodes=8",
        ],
    ),
    "python-tool-tiny": (
        (pytest.mark.docker, pytest.mark.bwrap),
        _needs_sandbox,
        [
            "warm_start.examples=8",
            "warm_start.epochs=1",
            "trainer.batch_size=4",
            "rollout.concurrency=4",
            "trainer.eval_episodes=4",
        ],
    ),
    "repo-coding-tiny": (
        (pytest.mark.docker, pytest.mark.bwrap),
        _needs_sandbox,
        ["trainer.eval_episodes=2"],
    ),
    "alfworld-tiny": (
        (pytest.mark.alfworld,),
        _needs_alfworld,
        [
            "warm_start.examples=2",
            "warm_start.epochs=1",
            "trainer.batch_size=2",
            "rollout.concurrency=2",
            "env.max_turns=3",
            "trainer.eval_episodes=3",
        ],
    ),
    # the preset behind `train --env` (its env.id placeholder is a built-in env that picks its own tasks)
    "env-tiny": ((), None, ["trainer.batch_size=4", "rollout.concurrency=4", "trainer.eval_episodes=2"]),
}


def test_every_tiny_preset_has_a_real_run_test() -> None:
    assert sorted(p for p in list_presets() if p.endswith("-tiny")) == sorted(_TINY_RUNS)


@pytest.mark.parametrize(
    "preset", [pytest.param(name, marks=marks, id=name) for name, (marks, _, _) in _TINY_RUNS.items()]
)
def test_tiny_preset_trains_to_its_end(preset: str, tmp_path: Path) -> None:
    """Each ``*-tiny`` preset runs for real (two steps): checkpoint, step metrics, held-out figures."""
    _, needs, overrides = _TINY_RUNS[preset]
    if needs is not None:
        needs()
    torch.set_num_threads(1)
    run = tmp_path / "run"
    started = time.monotonic()
    rc = main(
        [
            "train",
            preset,
            "trainer.steps=2",
            "trainer.checkpoint_every=2",
            "trainer.max_minutes=0",
            *overrides,
            "--run-dir",
            str(run),
        ]
    )
    assert rc == 0, f"{preset} did not train to its end"
    assert latest_checkpoint(run).name == "step_000002"
    steps = _events(run, "step")
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in steps)
    evals = {e["name"]: e for e in _events(run, "eval")}
    assert {"before", "after_rl"} <= set(evals)
    if preset == "alfworld-tiny":  # held-out figures per task type, over the same episodes
        by_group = evals["after_rl"]["by_group"]
        assert sum(g["tasks"] for g in by_group.values()) == evals["after_rl"]["episodes"] == 3
    assert _events(run, "end")[0]["reason"] == "steps"
    print(f"{preset}: {time.monotonic() - started:.0f}s")
