"""Exact resume on the Ray backend: the whole local Ray killed mid-run, ``--resume`` continues it.

Two Ray runs of the same small config (learner + one rollout worker on a local Ray): A
uninterrupted, B's driver started in its own process group and that whole group -- driver,
raylet, GCS, the learner and worker actors -- SIGKILLed after its step-2 checkpoint while later
steps and rollouts are in flight. ``fr-agents train --resume B`` then finishes B on a fresh local
Ray. Every batch must hold the same episodes, tokens and rewards in both runs, the final
parameters must agree, each step is logged once, and the episodes B's ledger acknowledged before
the kill are kept, not run again. Tolerances as in ``test_resume.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from fr_agents.ledger import EpisodeLedger  # noqa: E402
from tests.trainer.test_resume import OVERRIDES, _steps_logged, assert_resumed_run_matches, resume_point  # noqa: E402
from tests.trainer.test_resume import _train as _train_in_process  # noqa: E402

RAY = [*OVERRIDES, "trainer.backend=ray"]


def _train(args: list[str]) -> subprocess.Popen:
    # its own process group: the local Ray it starts lives in that group too
    return _train_in_process(args, start_new_session=True)


def _kill_group(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)


def _acknowledged(run: Path, steps: int) -> dict[int, int]:
    ledger = EpisodeLedger(run / "episodes.sqlite")
    out = {r[0]: r[1] for k in range(steps) for r in ledger.batch_rows(k)}
    ledger.close()
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_run_killed_then_resumed_matches_uninterrupted(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pa = _train(["math-tiny", *RAY, "--run-dir", str(a)])
    try:
        out_a, _ = pa.communicate(timeout=400)
    finally:
        _kill_group(pa)  # a local Ray never outlives its test
    assert pa.returncode == 0, out_a

    pb = _train(["math-tiny", *RAY, "--run-dir", str(b)])
    try:
        deadline = time.monotonic() + 400
        while _steps_logged(b) < 3 and time.monotonic() < deadline and pb.poll() is None:
            time.sleep(0.05)
        assert pb.poll() is None, "run B ended before it could be killed mid-run"
        assert (b / "checkpoints" / "step_000002").exists()
    finally:
        _kill_group(pb)
    pb.communicate(timeout=60)
    killed_at = _steps_logged(b)
    assert 3 <= killed_at < 6
    resumed_from = resume_point(b)
    before = _acknowledged(b, 6)  # episode -> leaf, as B's ledger held them at the kill

    pr = _train(["--resume", str(b)])
    try:
        out_r, _ = pr.communicate(timeout=400)
    finally:
        _kill_group(pr)
    assert pr.returncode == 0, out_r

    after = _acknowledged(b, 6)
    assert len(before) > 2 * 8, "the kill came before any batch beyond the checkpoint was acknowledged"
    assert all(after[ep] == leaf for ep, leaf in before.items()), "an acknowledged episode was run again"

    assert_resumed_run_matches(a, b, resumed_from)
