"""`fr-agents rollout`, `fr-agents play` and `fr-agents model` end to end (real subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fr_agents.tree import TrajectoryTree

HERE = Path(__file__).parent


def _cli(*argv: str, stdin: str | None = None, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1"
    )
    if cache is not None:
        env["FR_AGENTS_CACHE"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "fr_agents.cli", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_rollout_with_branch_writes_durable_tree(tmp_path, cache):
    out = tmp_path / "t.db"
    r = _cli(
        "rollout",
        "rollout_envs:fr_agents_test/Count-v0",
        "--model",
        "tiny-nano",
        "--episodes",
        "3",
        "--out",
        str(out),
        "--branch",
        "2",
        "--max-new-tokens",
        "6",
        "--max-turns",
        "2",
        cache=cache,
    )
    assert r.returncode == 0, r.stderr
    assert "episodes     3" in r.stdout and "leaves       6" in r.stdout and "tokens/s" in r.stdout
    with TrajectoryTree.open(out) as tree:
        stats = tree.stats()
        assert stats["leaves"] == 6 and stats["sharing_ratio"] > 1.0
        # Branching at the prompt: 2 leaves per episode under its root (equal prompts share a root).
        by_root: dict[int, int] = {}
        for leaf in tree.leaf_ids():
            by_root[tree.trajectory(leaf).root_id] = by_root.get(tree.trajectory(leaf).root_id, 0) + 1
        assert sum(by_root.values()) == 6 and all(n % 2 == 0 for n in by_root.values())


def test_play_human_from_pipe_runs_to_the_end(tmp_path):
    r = _cli(
        "play",
        "fr_agents/MathVerifier-v0",
        "--human",
        "--seed",
        "3",
        "--env-kwargs",
        '{"max_turns": 2}',
        stdin="\\boxed{-1}\n\\boxed{-2}\n",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("[action") == 2 and "[result] truncated" in r.stdout


def test_play_human_correct_answer(tmp_path):
    first = _cli("play", "fr_agents/MathVerifier-v0", "--human", "--seed", "4", stdin="x\n")
    problem = first.stdout.split("[observation]\n", 1)[1].split("=")[0]
    answer = eval(problem)  # the arithmetic task source asks "a+b="
    r = _cli("play", "fr_agents/MathVerifier-v0", "--human", "--seed", "4", stdin=f"\\boxed{{{answer}}}\n")
    assert r.returncode == 0 and "[reward] 1.0" in r.stdout and "[result] finished" in r.stdout


def test_play_model_streams_turns(cache):
    r = _cli(
        "play",
        "rollout_envs:fr_agents_test/Count-v0",
        "--model",
        "tiny-nano",
        "--max-new-tokens",
        "5",
        "--max-turns",
        "2",
        cache=cache,
    )
    assert r.returncode == 0, r.stderr
    assert "[model turn 0]" in r.stdout and "[model turn 1]" in r.stdout and "[result]" in r.stdout


def test_unknown_env_suggests_close_ids():
    r = _cli("play", "fr_agents/MathVerifer-v0", "--human", stdin="")
    assert r.returncode == 2 and "fr_agents/MathVerifier-v0" in r.stderr and "did you mean" in r.stderr


def test_unknown_model_lists_accepted_forms(tmp_path):
    r = _cli(
        "rollout", "fr_agents/MathVerifier-v0", "--model", "no-such-model", "--out", str(tmp_path / "x.db")
    )
    assert r.returncode == 2 and "smollm2-135m" in r.stderr and "tiny" in r.stderr
    r = _cli("model", "get", "not a model")
    assert r.returncode == 2 and "accepted forms" in r.stderr


def test_non_str_observation_names_env(cache):
    r = _cli("play", "rollout_envs:fr_agents_test/IntObs-v0", "--model", "tiny-nano", cache=cache)
    assert r.returncode == 2 and "fr_agents_test/IntObs-v0" in r.stderr


def test_bad_episode_count(tmp_path):
    r = _cli("rollout", "fr_agents/MathVerifier-v0", "--episodes", "0", "--out", str(tmp_path / "x.db"))
    assert r.returncode == 2 and "--episodes" in r.stderr
