"""The eval runner on the real arithmetic bench with the nano model: seeds, resume, settings checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium
import pytest
import torch

from envs.benches import resolve_bench
from fr_agents.eval import Bench, BenchItem, EvalSettings, EvalSettingsMismatch, run_bench
from fr_agents.models import load_policy
from fr_agents.policy.hf import HFEngine
from fr_agents.spaces import AnyText

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy(checkpoints: dict[str, Path]) -> Any:
    model, tokenizer = load_policy(str(checkpoints["before"]))
    engine = HFEngine(model, tokenizer, max_batch_size=64)
    yield engine, tokenizer
    engine.close_sync()


def rows(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def strip_timing(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without wall-clock fields (the row's ``seconds``, the verifier's ``verify_seconds``)."""
    out = []
    for r in rs:
        r = {k: v for k, v in r.items() if k != "seconds"}
        r["env_info"] = {k: v for k, v in r["env_info"].items() if "seconds" not in k}
        out.append(r)
    return sorted(out, key=lambda r: (r["task_id"], r["sample"]))


def test_one_row_per_sample_with_the_fields_and_a_consistent_summary(policy: Any, tmp_path: Path) -> None:
    engine, tok = policy
    bench = resolve_bench("arithmetic", 6)
    res = run_bench(engine, tok, bench, EvalSettings(k=3, temperature=1.0), label="nano", out_dir=tmp_path)
    got = rows(res.samples_file)
    assert len(got) == 18 and res.new_samples == 18
    assert {(r["task_id"], r["sample"]) for r in got} == {(it.id, s) for it in bench.items for s in range(3)}
    first = got[0]
    assert {
        "checkpoint",
        "bench",
        "task_id",
        "sample",
        "seed",
        "env_seed",
        "reward",
        "success",
        "status",
        "actions",
    } <= set(first)
    assert first["checkpoint"] == "nano" and first["bench"] == "arithmetic" and len(first["actions"]) == 1
    # The k samples of a problem share the env seed and differ in the sampling seed.
    same_task = [r for r in got if r["task_id"] == bench.items[0].id]
    assert len({r["env_seed"] for r in same_task}) == 1 and len({r["seed"] for r in same_task}) == 3
    mean = sum(r["reward"] for r in got) / len(got)
    assert res.metrics["mean@k"] == pytest.approx(mean)
    assert res.tasks == 6 and res.samples == 18 and set(res.metrics) >= {"pass@1", "pass@2", "pass@3"}


def test_runs_are_deterministic_given_the_seeds(policy: Any, tmp_path: Path) -> None:
    engine, tok = policy
    bench = resolve_bench("arithmetic", 5)
    settings = EvalSettings(k=2, temperature=1.0, seed=7, concurrency=1)
    a = run_bench(engine, tok, bench, settings, label="x", out_dir=tmp_path / "a")
    b = run_bench(engine, tok, bench, settings, label="x", out_dir=tmp_path / "b")
    assert strip_timing(rows(a.samples_file)) == strip_timing(rows(b.samples_file))
    c = run_bench(
        engine,
        tok,
        bench,
        EvalSettings(k=2, temperature=1.0, seed=8, concurrency=1),
        label="x",
        out_dir=tmp_path / "c",
    )
    assert [r["seed"] for r in strip_timing(rows(c.samples_file))] != [
        r["seed"] for r in strip_timing(rows(a.samples_file))
    ]


def test_resume_skips_done_samples_extends_k_and_repairs_a_torn_line(policy: Any, tmp_path: Path) -> None:
    engine, tok = policy
    bench = resolve_bench("arithmetic", 4)
    r1 = run_bench(engine, tok, bench, EvalSettings(k=1), label="ck", out_dir=tmp_path)
    before = rows(r1.samples_file)
    r2 = run_bench(engine, tok, bench, EvalSettings(k=3), label="ck", out_dir=tmp_path)
    assert r2.new_samples == 8  # samples 1 and 2 of each of the 4 problems
    assert rows(r2.samples_file)[:4] == before  # sample 0 rows were kept, not redrawn
    r3 = run_bench(engine, tok, bench, EvalSettings(k=3), label="ck", out_dir=tmp_path)
    assert r3.new_samples == 0 and r3.metrics == r2.metrics
    # A crash mid-write leaves a torn last line: it is cut off and that one sample is redrawn.
    path = Path(r3.samples_file)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    r4 = run_bench(engine, tok, bench, EvalSettings(k=3), label="ck", out_dir=tmp_path)
    assert r4.new_samples == 1 and len(rows(path)) == 12


def test_resuming_with_other_settings_is_refused_naming_the_fields(policy: Any, tmp_path: Path) -> None:
    engine, tok = policy
    bench = resolve_bench("arithmetic", 2)
    run_bench(engine, tok, bench, EvalSettings(k=1, temperature=1.0), label="ck", out_dir=tmp_path)
    with pytest.raises(EvalSettingsMismatch, match=r"temperature: 1\.0 -> 0\.5"):
        run_bench(engine, tok, bench, EvalSettings(k=1, temperature=0.5), label="ck", out_dir=tmp_path)
    # Another label (checkpoint) is another file: no conflict.
    run_bench(engine, tok, bench, EvalSettings(k=1, temperature=0.5), label="other", out_dir=tmp_path)


def test_greedy_needs_k1_and_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="^k: greedy"):
        EvalSettings(k=2, temperature=0)
    with pytest.raises(ValueError, match="^temperature"):
        EvalSettings(temperature=-1)
    with pytest.raises(ValueError, match="^max_new_tokens"):
        EvalSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match="^k:"):
        EvalSettings(k=0)


class OptionsEnv(gymnasium.Env):
    """Reward 1 when reset received the bench item's options; draws a number from the seed otherwise."""

    def __init__(self) -> None:
        self.observation_space = AnyText(1000)
        self.action_space = AnyText(100000)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.got = options
        self.drawn = int(self.np_random.integers(1_000_000))
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.got is None:  # a drawn problem: the reward is the draw, so equal rewards = one problem
            return "", self.drawn / 1_000_000, True, False, {"drawn": self.drawn}
        ok = self.got == {"game": "g1.tw", "level": 2}
        return "", float(ok), True, False, {"won": ok, "got": self.got}


def test_items_pass_their_own_reset_options_and_no_options_means_a_seeded_draw(
    policy: Any, tmp_path: Path
) -> None:
    engine, tok = policy
    bench = Bench(
        name="opts",
        env_id="unused",
        items=[BenchItem("game-1", {"game": "g1.tw", "level": 2}), BenchItem("draw-0"), BenchItem("draw-1")],
        max_new_tokens=2,
        max_context=64,
    )
    res = run_bench(engine, tok, bench, EvalSettings(k=3), label="m", out_dir=tmp_path, make_env=OptionsEnv)
    got = rows(res.samples_file)
    game = [r for r in got if r["task_id"] == "game-1"]
    assert all(r["reward"] == 1.0 and r["success"] for r in game)
    assert game[0]["env_info"]["got"] == {"game": "g1.tw", "level": 2}
    draws = {
        tid: {r["env_info"]["drawn"] for r in got if r["task_id"] == tid} for tid in ("draw-0", "draw-1")
    }
    assert all(len(d) == 1 for d in draws.values())  # the k samples of a drawn problem face the same problem
    assert draws["draw-0"] != draws["draw-1"]  # and different items draw different problems


def test_bench_validates_items() -> None:
    with pytest.raises(ValueError, match="occurs more than once"):
        Bench(name="b", env_id="e", items=[BenchItem("a"), BenchItem("a")])
    with pytest.raises(ValueError, match="has no items"):
        Bench(name="b", env_id="e", items=[])
    with pytest.raises(ValueError, match="primary"):
        Bench(name="b", env_id="e", items=[BenchItem("a")], primary="best")
    with pytest.raises(ValueError, match="BenchItem.id"):
        BenchItem("")


def test_items_with_a_group_get_their_figures_per_group(policy: Any, tmp_path: Path) -> None:
    """``extra["by_group"]`` holds, per group, the figures of that group's rows alone; rows carry
    their item's group; a bench without groups has no breakdown."""
    engine, tok = policy
    plain = resolve_bench("arithmetic", 6)
    items = [
        BenchItem(it.id, it.options, it.seed, "even" if i % 2 == 0 else "odd")
        for i, it in enumerate(plain.items)
    ]
    bench = Bench(**{**plain.__dict__, "items": items})
    res = run_bench(engine, tok, bench, EvalSettings(k=2, temperature=1.0), label="nano", out_dir=tmp_path)
    got = rows(res.samples_file)
    group_of = {it.id: it.group for it in items}
    assert all(r["group"] == group_of[r["task_id"]] for r in got)
    assert sorted(res.extra["by_group"]) == ["even", "odd"]
    for g, figures in res.extra["by_group"].items():
        mine = [r for r in got if r["group"] == g]
        assert figures["tasks"] == 3
        assert figures["success"] == pytest.approx(sum(r["success"] for r in mine) / 6)
        assert figures["mean@k"] == pytest.approx(sum(r["reward"] for r in mine) / 6)
        assert figures["turns"] == pytest.approx(sum(r["turns"] for r in mine) / 6)
    assert (
        run_bench(
            engine, tok, plain, EvalSettings(k=1, temperature=0.0), label="nano", out_dir=tmp_path / "plain"
        ).extra["by_group"]
        == {}
    )
