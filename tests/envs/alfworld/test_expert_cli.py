"""`--agent expert` in `fr-agents rollout` (stored SFT demos) and `fr-agents eval` (reported as 'expert')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from fr_agents.models import resolve_model
from fr_agents.tree import TrajectoryTree

pytestmark = pytest.mark.alfworld
ROOT = Path(__file__).resolve().parents[3]


def _cli(*argv: str, games_root: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if games_root is not None:
        env["FR_AGENTS_ALFWORLD_GAMES"] = games_root
    cmd = [sys.executable, "-m", "fr_agents.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


def test_rollout_agent_expert_stores_won_demos(games_root: str, tmp_path: Path) -> None:
    out = tmp_path / "demos.db"
    kwargs = json.dumps({"games_dir": games_root, "split": "valid_seen"})
    r = _cli(
        "rollout",
        "fr_agents/ALFWorld-v0",
        "--agent",
        "expert",
        "--episodes",
        "2",
        "--max-turns",
        "50",
        "--max-context",
        "16384",
        "--concurrency",
        "1",
        "--out",
        str(out),
        "--env-kwargs",
        kwargs,
    )
    assert r.returncode == 0, r.stderr
    assert "expert       won 2/2" in r.stdout
    tok = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    with TrajectoryTree.open(str(out)) as tree:
        trajs = tree.trajectories(tree.leaf_ids())
    assert len(trajs) == 2
    for tr in trajs:
        assert tr.status == "finished" and tr.reward == 1.0 and tr.info["won"] is True
        # Expert tokens are demos, never policy samples: the trainer's objective cannot use them as such.
        assert not any(tr.policy_mask) and set(tr.versions) == {-1}
        replies = [tok.decode(tr.token_ids[s:e]) for s, e in tr.info["demo_spans"]]
        assert len(replies) == tr.info["turns"] >= 2
        assert all(x.startswith("<action>") and x.endswith("</action><|im_end|>") for x in replies)


def test_eval_agent_expert_reports_success(games_root: str, tmp_path: Path) -> None:
    r = _cli(
        "eval",
        "--agent",
        "expert",
        "--bench",
        "alfworld-seen",
        "--limit",
        "2",
        "--concurrency",
        "1",
        "--out",
        str(tmp_path),
        games_root=games_root,
    )
    assert r.returncode == 0, r.stderr
    assert "| expert |" in r.stdout
    rows = json.loads((tmp_path / "results.json").read_text())
    rows = rows["results"] if isinstance(rows, dict) else rows
    (row,) = rows
    assert row["label"] == "expert" and row["bench"] == "alfworld-seen" and row["tasks"] == 2
    assert row["metrics"]["success"] == 1.0 and row["metrics"]["mean@k"] == 1.0


def test_agent_expert_on_an_env_without_expert_names_it(tmp_path: Path) -> None:
    r = _cli(
        "rollout",
        "fr_agents/MathVerifier-v0",
        "--agent",
        "expert",
        "--episodes",
        "1",
        "--out",
        str(tmp_path / "x.db"),
    )
    assert r.returncode == 2
    assert "env fr_agents/MathVerifier-v0 has no expert" in r.stderr


def test_eval_reports_by_task_type_with_the_env_kwargs_a_run_trained_with(
    games_root: str, tmp_path: Path
) -> None:
    """`fr-agents eval` on an ALFWorld bench breaks success down by task type (results.md and
    results.json), and `--env-kwargs` is merged into the bench's env kwargs (kept with the samples)."""
    r = _cli(
        "eval",
        "--agent",
        "expert",
        "--bench",
        "alfworld-unseen",
        "--limit",
        "3",
        "--concurrency",
        "2",
        "--env-kwargs",
        '{"list_admissible": false}',
        "--out",
        str(tmp_path),
        games_root=games_root,
    )
    assert r.returncode == 0, r.stderr
    (res,) = json.loads((tmp_path / "results.json").read_text())["results"]
    by_group = res["extra"]["by_group"]
    samples = [json.loads(x) for x in Path(res["samples_file"]).read_text().splitlines()]
    assert sorted(by_group) == sorted({s["group"] for s in samples}) and len(by_group) == 3  # 3 types of 6
    for s in samples:
        assert s["group"] == s["env_info"]["task_type"]
        assert by_group[s["group"]] == {
            "tasks": 1,
            "mean@k": 1.0,
            "success": 1.0,
            "pass@1": 1.0,
            "turns": float(s["turns"]),
        }
    md = (tmp_path / "results.md").read_text()
    assert "## alfworld-unseen by group (success %, tasks)" in md
    assert all(f"| {g} | 1 | 100.0 |" in md for g in by_group)
    meta = json.loads(next((tmp_path / "samples" / "expert").glob("*.meta.json")).read_text())
    assert meta["env_kwargs"] == {"split": "valid_unseen", "list_admissible": False}


def test_eval_env_kwargs_reach_the_env_and_must_be_a_json_object(games_root: str, tmp_path: Path) -> None:
    r = _cli(
        "eval", "--agent", "expert", "--bench", "arithmetic", "--env-kwargs", "[1]", "--out", str(tmp_path)
    )
    assert r.returncode == 2 and "--env-kwargs: must be a JSON object" in r.stderr
    r = _cli(
        "eval",
        "--agent",
        "expert",
        "--bench",
        "alfworld-unseen",
        "--limit",
        "1",
        "--env-kwargs",
        '{"max_turns": 0}',
        "--out",
        str(tmp_path / "bad"),
        games_root=games_root,
    )
    assert r.returncode != 0 and "max_turns must be >= 1, got 0" in r.stderr


def test_eval_env_kwargs_may_not_change_the_games_a_bench_chose(games_root: str, tmp_path: Path) -> None:
    """`alfworld-unseen` lists the valid_unseen game files; `split` or `games_dir` in --env-kwargs would
    not change them, so the command stops before any episode and says how to pick other games."""
    for kwargs in ('{"split": "train"}', json.dumps({"games_dir": games_root, "list_admissible": False})):
        r = _cli(
            "eval",
            "--agent",
            "expert",
            "--bench",
            "alfworld-unseen",
            "--limit",
            "1",
            "--env-kwargs",
            kwargs,
            "--out",
            str(tmp_path / "out"),
            games_root=games_root,
        )
        assert r.returncode == 2, r.stderr
        assert "--env-kwargs: " in r.stderr and "bench 'alfworld-unseen' chose its items by" in r.stderr
        assert "ENV_ID:SPLIT takes any split" in r.stderr
        assert not (tmp_path / "out" / "results.json").exists()
