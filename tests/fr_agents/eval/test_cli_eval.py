"""``fr-agents eval``: tiny checkpoints before and after a supervised fit, compared on the
arithmetic bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fr_agents.cli import main

torch.set_num_threads(1)


def test_eval_shows_the_difference_between_checkpoints_before_and_after_training(
    checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = ["eval", str(checkpoints["before"]), str(checkpoints["after"]), "--bench", "arithmetic"]
    argv += ["--limit", "16", "-k", "4", "--temperature", "1.0", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert data["checkpoints"] == ["before", "after"]
    by = {r["label"]: r for r in data["results"]}
    assert by["before"]["tasks"] == 16 and by["before"]["k"] == 4
    before, after = by["before"]["metrics"], by["after"]["metrics"]
    assert after["mean@k"] >= before["mean@k"] + 0.5, (before, after)
    assert after["pass@4"] >= 0.9 and before["pass@1"] <= 0.2
    md = (out / "results.md").read_text()
    assert "| before |" in md and "| after |" in md and "arithmetic **mean@4**" in md
    assert md in printed or "| after |" in printed
    png = (out / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    rows = (out / "samples" / "after" / "arithmetic.jsonl").read_text().splitlines()
    assert len(rows) == 16 * 4
    # Run again: every sample is on disk, nothing is redrawn, the same numbers come out.
    assert main(argv) == 0
    assert (
        json.loads((out / "results.json").read_text())["results"][1]["metrics"]
        == data["results"][1]["metrics"]
    )
    assert (out / "samples" / "after" / "arithmetic.jsonl").read_text().splitlines() == rows


def test_eval_list_and_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in (
        "arithmetic",
        "humaneval",
        "champ",
        "alfworld-seen",
        "alfworld-unseen",
        "repo-coding",
        "rg:",
        "jsonl:",
    ):
        assert name in listed
    assert main(["eval", "tiny", "--bench", "arithmetc", "--out", str(tmp_path)]) == 2
    assert "unknown bench 'arithmetc'. Did you mean: arithmetic" in capsys.readouterr().err
    assert main(["eval", "tiny", "--out", str(tmp_path)]) == 2
    assert "--bench" in capsys.readouterr().err
    assert (
        main(
            ["eval", "tiny", "--bench", "arithmetic", "-k", "2", "--temperature", "0", "--out", str(tmp_path)]
        )
        == 2
    )
    assert "greedy" in capsys.readouterr().err
    assert (
        main(["eval", "no/such/dir/x", "--bench", "arithmetic", "--limit", "1", "--out", str(tmp_path)]) == 2
    )
    assert "accepted forms" in capsys.readouterr().err


def test_eval_of_a_run_plays_as_its_own_held_out_evaluations_did(
    checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fr-agents eval RUN` with no sampling flags: greedy (the run's held-out figures are greedy), in
    the run's rollout.dtype and rollout.concurrency; its samples are those of the checkpoint evaluated
    with all three given explicitly. At -k > 1 it samples at the run's trainer.eval_temperature (its
    avg@k evaluations). Each flag still wins; a bare checkpoint keeps temperature 1, float32 and 32."""
    import shutil

    from fr_agents.config import load_config
    from fr_agents.config_io import dump_config
    from fr_agents.run_layout import STATE_FILE

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000001"
    shutil.copytree(checkpoints["after"], step)
    (step / STATE_FILE).write_bytes(b"")  # marks the checkpoint complete (latest_checkpoint reads no more)
    cfg = load_config(
        "math-tiny", ["rollout.dtype=bfloat16", "rollout.concurrency=3", "trainer.eval_temperature=0.7"]
    )
    dump_config(cfg, run / "config.yaml")

    def samples(*argv: str) -> tuple[str, float, list[dict]]:
        out = tmp_path / f"eval{len(list(tmp_path.iterdir()))}"
        common = ["--bench", "arithmetic", "--limit", "6", "--label", "x", "--out", str(out)]
        assert main(["eval", *argv, *common]) == 0
        err = capsys.readouterr().err
        where = out / "samples" / "x"
        meta = json.loads((where / "arithmetic.meta.json").read_text())
        rows = [json.loads(r) for r in (where / "arithmetic.jsonl").read_text().splitlines()]
        return err, meta["temperature"], [{k: r[k] for k in ("task_id", "actions", "reward")} for r in rows]

    err, temperature, from_run = samples(str(run))
    assert "as the run at" in err and "bfloat16, 3 episodes at once, greedy" in err
    assert temperature == 0.0
    _, _, explicit = samples(str(step), "--dtype", "bfloat16", "--concurrency", "3", "--temperature", "0")
    assert from_run == explicit
    err, temperature, _ = samples(str(run), "-k", "2")
    assert "temperature 0.7" in err and temperature == 0.7
    err, temperature, _ = samples(str(run), "--dtype", "float32", "--temperature", "1")
    assert "float32, 3 episodes at once, temperature 1" in err and temperature == 1.0
    err, temperature, _ = samples(str(checkpoints["after"]))
    assert "as the run at" not in err and temperature == 1.0


def test_eval_without_a_terminal_logs_its_progress_each_tenth_of_the_samples(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under pytest stderr is no terminal (as in a log file or CI, where a live bar draws nothing):
    the command logs a line each time another tenth of the samples is done."""
    import logging

    argv = ["eval", "tiny", "--bench", "arithmetic", "--limit", "20", "--label", "x", "--out", str(tmp_path)]
    with caplog.at_level(logging.INFO, logger="fr_agents.eval.runner"):
        assert main(argv) == 0
    lines = [r.getMessage() for r in caplog.records if "samples, mean reward" in r.getMessage()]
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == [f"{2 * i}/20" for i in range(1, 11)]
    assert all(line.startswith("x · arithmetic: ") and line.endswith(" min") for line in lines)
