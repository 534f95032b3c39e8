"""Every config key drives code or is refused; every field has help; one home per rule.

The runs here are built from non-default values and each value is looked up where it must take
effect (the engine, the schedule, the runner's sampling options, the env, the task splits, the
learner, the run's checkpoints). Keys that training cannot honour yet are refused by name.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from fr_agents.config import (
    ConfigError,
    TrainConfig,
    field_help,
    iter_fields,
    load_config,
)
from tests.trainer.learners import make_learner

ROOT = Path(__file__).resolve().parents[2]

FAST = [
    "model.tiny_size=nano",
    "trainer.eval_episodes=0",
    "warm_start.examples=0",
    "trainer.threads=1",
    "trainer.collapse_guard=false",
]


def test_every_field_has_one_line_of_help() -> None:
    missing = [key for key, f in iter_fields() if not f.metadata.get("help", "").strip()]
    assert not missing, f"fields without help: {missing}"
    multi = [key for key, f in iter_fields() if "\n" in f.metadata["help"]]
    assert not multi, f"help must be one line: {multi}"


def test_defaults_obey_their_own_rules() -> None:
    cfg = TrainConfig()
    for key, f in iter_fields():
        rule = f.metadata.get("rule")
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if rule is not None:
            rule(value)
        if f.metadata.get("choices"):
            assert value in f.metadata["choices"], key


def test_dry_run_shows_each_value_with_its_help() -> None:
    from trainer.preflight import dry_run_report

    cfg = load_config("math-tiny", ["objective.delta=0.5"])
    report = dry_run_report(cfg)
    for key, f in iter_fields():
        leaf = key.rsplit(".", 1)[-1]
        lines = [ln for ln in report.splitlines() if ln.strip().startswith(f"{leaf}:")]
        assert any(ln.rstrip().endswith("# " + f.metadata["help"]) for ln in lines), key
    assert any(ln.strip().startswith("delta: 0.5") for ln in report.splitlines())


def test_unknown_key_names_the_closest_key_and_its_help() -> None:
    with pytest.raises(ConfigError) as e:
        load_config("math-tiny", ["rollout.temprature=0.5"])
    msg = str(e.value)
    assert "Did you mean: rollout.temperature" in msg
    assert field_help("rollout.temperature") in msg


def _sections() -> tuple[dict[str, str], set[str]]:
    """``{section field: its config class name}`` of ``TrainConfig`` and its top-level scalar keys."""
    import dataclasses
    import typing

    from fr_agents.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    fields = dataclasses.fields(TrainConfig)
    sections = {f.name: hints[f.name].__name__ for f in fields if dataclasses.is_dataclass(hints[f.name])}
    return sections, {f.name for f in fields} - set(sections)


def config_reads(source: str) -> set[str]:
    """The config keys ``source`` reads by their full path: ``<anything>.section.key``, or ``name.key``
    where ``name`` stands for a section (``ws = cfg.warm_start``, ``o, opt = cfg.objective, cfg.optim``,
    ``with ... as``, or an argument annotated with the section's class), and the top-level keys."""
    sections, top = _sections()
    by_class = {cls: name for name, cls in sections.items()}
    tree = ast.parse(source)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
            if (
                len(node.targets) == 1
                and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple)
            ):
                pairs = list(zip(node.targets[0].elts, node.value.elts, strict=False))
            for target, value in pairs:
                if (
                    isinstance(target, ast.Name)
                    and isinstance(value, ast.Attribute)
                    and value.attr in sections
                ):
                    alias[target.id] = value.attr
        elif isinstance(node, ast.arg) and node.annotation is not None:
            ann = node.annotation
            name = (
                ann.id
                if isinstance(ann, ast.Name)
                else ann.attr
                if isinstance(ann, ast.Attribute)
                else (
                    ann.value.rsplit(".", 1)[-1]
                    if isinstance(ann, ast.Constant) and isinstance(ann.value, str)
                    else None
                )
            )
            if name in by_class:
                alias[node.arg] = by_class[name]
    reads: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Attribute) and base.attr in sections:
            reads.add(f"{base.attr}.{node.attr}")
        elif isinstance(base, ast.Name) and base.id in alias:
            reads.add(f"{alias[base.id]}.{node.attr}")
        elif node.attr in top:
            reads.add(node.attr)
    return reads


def test_every_key_is_read_by_code() -> None:
    """A key that no code outside ``fr_agents/config.py`` reads, by its full path, is a lie: reading
    ``optim.lr`` does not make ``warm_start.lr`` read."""
    read: set[str] = set()
    for pkg in ("fr_agents", "trainer", "envs"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path != ROOT / "fr_agents" / "config.py":
                read |= config_reads(path.read_text(encoding="utf-8"))
    unread = [key for key, _ in iter_fields() if key not in read]
    assert not unread, f"config keys that no code reads: {unread}"


def test_a_key_read_only_under_another_sections_name_counts_as_unread() -> None:
    """The full path decides: ``optim.lr`` read, ``warm_start.lr`` not."""
    code = (
        "def f(cfg):\n    ws = cfg.warm_start\n    o, opt = cfg.objective, cfg.optim\n"
        "    return opt.lr, ws.epochs, o.delta\n"
    )
    reads = config_reads(code)
    assert {"optim.lr", "warm_start.epochs", "objective.delta"} <= reads
    assert "warm_start.lr" not in reads


def test_bad_branching_values_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.branch_factor: 2 needs rollout\.branch_at"):
        load_config("math-tiny", ["rollout.branch_factor=2"])
    with pytest.raises(ConfigError, match=r"rollout\.branch_at: \[1\] forks nothing"):
        load_config("math-tiny", ["rollout.branch_at=[1]"])
    with pytest.raises(ConfigError, match=r"rollout\.branch_at: turn 1 is never reached"):
        load_config("math-tiny", ["rollout.branch_factor=2", "rollout.branch_at=[1]"])
    with pytest.raises(ConfigError, match=r"rollout\.branch_at: must hold turn indices >= 0"):
        load_config("python-tool-tiny", ["rollout.branch_factor=2", "rollout.branch_at=[-1]"])
    with pytest.raises(ConfigError, match=r"rollout\.branch_at: lists a turn twice"):
        load_config("env-tiny", ["rollout.branch_factor=2", "rollout.branch_at=[1,1]"])
    with pytest.raises(
        ConfigError, match=r"trainer\.batch_size: 8 must be a multiple of the leaves per scheduled prompt, 3"
    ):
        load_config(
            "python-tool-tiny", ["trainer.batch_size=8", "rollout.branch_factor=3", "rollout.branch_at=[1]"]
        )
    with pytest.raises(ConfigError, match=r"trainer\.max_per_root: "):
        load_config("math-tiny", ["trainer.max_per_root=0"])
    with pytest.raises(ConfigError, match=r"objective\.baseline: tree is a FlashREINFORCE baseline"):
        load_config("math-tiny", ["objective.algo=grpo", "objective.baseline=tree"])
    with pytest.raises(
        ConfigError, match=r"objective\.negative_min_prob: 0\.01 filters FlashREINFORCE's tokens"
    ):
        load_config("math-tiny", ["objective.algo=grpo", "objective.negative_min_prob=0.01"])
    with pytest.raises(
        ConfigError,
        match=r"objective\.negative_min_prob_scope: suffix says where objective\.negative_min_prob cuts",
    ):
        load_config("math-tiny", ["objective.negative_min_prob_scope=suffix"])
    with pytest.raises(ConfigError, match=r"objective\.negative_min_prob_scope: invalid value 'row'"):
        load_config("python-tool-tiny", ["objective.negative_min_prob_scope=row"])
    cfg = load_config(
        "python-tool-tiny", ["rollout.branch_factor=4", "rollout.branch_at=[1]", "trainer.max_per_root=3"]
    )
    assert (cfg.rollout.branch_factor, cfg.rollout.branch_at, cfg.trainer.max_per_root) == (4, [1], 3)
    with pytest.raises(ConfigError, match=r"rollout\.engine: invalid value 'openai'"):
        load_config("math-tiny", ["rollout.engine=openai"])
    with pytest.raises(ConfigError, match=r"warm_start\.examples: tasks\.source=env-reset"):
        load_config("env-tiny", ["warm_start.examples=5"])


def test_env_kwargs_given_whole_replace_the_preset_mapping() -> None:
    assert load_config("math-tiny").env.kwargs == {"answer_format": "plain"}
    assert load_config("math-tiny", ["env.kwargs={}"]).env.kwargs == {}
    assert load_config("math-tiny", ["env.kwargs={format_reward: 0.5}"]).env.kwargs == {"format_reward": 0.5}
    merged = load_config("math-tiny", ["env.kwargs.format_reward=0.5"]).env.kwargs
    assert merged == {"answer_format": "plain", "format_reward": 0.5}


def test_a_dotted_entry_of_a_free_form_mapping_is_read_as_yaml_like_the_preset_file() -> None:
    """``tasks.params.size=600`` is the number 600, as ``size: 600`` in a YAML preset is; it used to
    reach the task source as the text '600' and fail there."""
    cfg = load_config(
        "python-tool-tiny",
        [
            "tasks.params.size=600",
            "tasks.params.ops=['+']",
            "env.kwargs.call_timeout=3",
            "env.kwargs.backend=docker",
            "env.kwargs.tool_prompt=",
            "tasks.params.order=random",
        ],
    )
    assert cfg.tasks.params["size"] == 600 and type(cfg.tasks.params["size"]) is int
    assert cfg.tasks.params["ops"] == ["+"] and cfg.tasks.params["order"] == "random"
    assert cfg.env.kwargs["call_timeout"] == 3 and cfg.env.kwargs["backend"] == "docker"
    assert cfg.env.kwargs["tool_prompt"] == "" and type(cfg.env.kwargs["backend"]) is str
    from envs.tasks import get_task_source

    source = get_task_source(cfg.tasks.source, seed=cfg.tasks.seed, **cfg.tasks.params)
    assert len(source.split("train")) + len(source.split("test")) == 600


def test_each_value_rule_has_one_home() -> None:
    """The objective and the learner refuse a bad value with the config's own rule and words."""
    from trainer.objective import flashreinforce_loss

    for key, arg, bad in (
        ("objective.delta", "delta", -1.0),
        ("objective.negative_token_fraction", "negative_token_fraction", 1.5),
        ("objective.aggregation", "aggregation", "sum"),
    ):
        with pytest.raises(ConfigError) as c:
            load_config("math-tiny", [f"{key}={bad}"])
        why = str(c.value).split(": ", 1)[1]
        with pytest.raises(ValueError) as lrn:
            make_learner(torch.nn.Linear(2, 2), **{arg: bad})
        assert str(lrn.value) == f"{arg}: {why}"
        t = torch.zeros(1, 2)
        with pytest.raises(ValueError) as obj:
            flashreinforce_loss(t - 1, t - 1, torch.ones(1), torch.ones(1, 2, dtype=torch.bool), **{arg: bad})
        assert str(obj.value) == f"{arg}: {why}"


def test_non_default_values_take_effect_where_they_should(tmp_path: Path) -> None:
    from fr_agents.models import tiny_dir
    from fr_agents.policy.hf import HFEngine
    from trainer.loop import Trainer
    from trainer.parts import build_rollout_side

    cfg = load_config(
        "math-tiny",
        [
            *FAST,
            "model.tiny_seed=3",
            "model.dtype=float64",
            "env.kwargs={answer_format: plain, format_reward: 0.25}",
            "env.system_prompt=Answer with digits only.",
            "env.max_turns=2",
            "tasks.params={digits: 1}",
            "tasks.seed=4",
            "tasks.train_split=test",
            "tasks.test_split=train",
            "rollout.temperature=0.7",
            "rollout.max_new_tokens=5",
            "rollout.max_context=100",
            "rollout.concurrency=3",
            "rollout.max_policy_lag=3",
            "rollout.turn_reward=last",
            "rollout.top_p=0.9",
            "objective.importance_sampling=false",
            "trainer.batch_size=6",
            "trainer.seed=5",
            "warm_start.examples=3",
        ],
    )
    t = Trainer(cfg, tmp_path, console=False)
    t.build()
    # the rollout side as the rollout process builds it (trainer.backend=process, the default);
    # the learner's process holds no engine of its own
    rollout = build_rollout_side(cfg, tmp_path / "rollout")
    try:
        assert Path(t.learner_side.model_dir) == tiny_dir("nano", 3)
        assert next(t.model.parameters()).dtype == torch.float64
        assert t.runner.engine is None
        assert isinstance(rollout.runner.engine, HFEngine)
        assert next(rollout.runner.engine.model.parameters()).dtype == torch.float64
        assert rollout.runner.engine.max_batch_size == 3
        env = t.rollout_side.make_env()
        assert env.unwrapped.format_reward == 0.25
        env.close()
        o = t.runner.options
        assert (o.temperature, o.max_new_tokens, o.max_context, o.max_turns, o.turn_reward, o.top_p) == (
            0.7,
            5,
            100,
            2,
            "last",
            0.9,
        )
        assert o.system_prompt == "Answer with digits only." and not o.importance_correction
        assert "Answer with digits only." in t.learner_side.tokenizer.decode(
            t.runner.encode_observation("1+1=")
        )
        assert t.learner.policy.config.temperature == 0.7
        # tasks: 1-digit problems, the splits swapped, the first 3 train tasks are demos
        from envs.tasks import get_task_source

        src = get_task_source("arithmetic", seed=4, digits=1)
        assert [x["id"] for x in t.rollout_side.train_tasks] == [x["id"] for x in src.split("test")]
        assert [x["id"] for x in t.rollout_side.test_tasks] == [x["id"] for x in src.split("train")]
        side = t.rollout_side
        assert side.demo_tasks == list(side.train_tasks[:3]) and side.rl_tasks == list(side.train_tasks[3:])
        s = t.rollout_side.schedule
        assert (s.batch_size, s.max_policy_lag, s.seed, s.task_seed) == (6, 3, 5, 4)
        assert s.sampling_version(5) == 2 and len(s.episodes(0)) == 6
        assert torch.get_num_threads() == 1
    finally:
        t.rollout_side.close()
        rollout.close()


def test_run_level_keys_take_effect(tmp_path: Path) -> None:
    """steps, checkpoint_every, keep_checkpoints, plot_every and the lag, in one run."""
    from trainer.loop import run_training

    torch.set_num_threads(1)
    cfg = load_config(
        "math-tiny",
        [
            *FAST,
            "tasks.params={digits: 1}",
            "trainer.batch_size=4",
            "rollout.concurrency=4",
            "trainer.steps=4",
            "trainer.checkpoint_every=2",
            "trainer.keep_checkpoints=1",
            "trainer.plot_every=3",
            "rollout.max_policy_lag=0",
        ],
    )
    res = run_training(cfg, tmp_path, console=False)
    assert res.ok and res.steps == 4
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000000", "step_000004"], ckpts  # the start of RL is kept whatever keep says
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(r["lag_max"] == 0 for r in steps)
    assert (tmp_path / "curves.png").exists()


def test_the_dry_run_phases_are_the_evaluations_a_run_makes(tmp_path: Path) -> None:
    """The plan's phases line names each held-out evaluation a real run then logs, in order, with
    its number of problems (the periodic ones on trainer.eval_during_episodes of them, at every step
    but the last: the evaluation after RL follows it at the same weights on the same games and more)."""
    from trainer.loop import main_train
    from trainer.preflight import phases_plan

    overrides = [
        "trainer.steps=3",
        "trainer.eval_every=1",
        "trainer.eval_episodes=6",
        "trainer.eval_during_episodes=2",
        "warm_start.examples=16",
        "warm_start.epochs=1",
        "trainer.threads=1",
    ]
    plan = phases_plan(load_config("math-tiny", overrides))
    assert main_train("math-tiny", overrides, run_dir=str(tmp_path / "run")) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["name"], r["step"], r["episodes"]) for r in rows if r.get("kind") == "eval"]
    assert evals == [
        ("before", 0, 6),
        ("after_warm_start", 0, 6),
        ("during", 1, 2),
        ("during", 2, 2),
        ("after_rl", 3, 6),
    ]
    assert plan == (
        "phases: held-out (6 test tasks, greedy) before -> warm start (16 gold demos x 1 epochs) -> "
        "held-out (6 test tasks, greedy) after the warm start -> RL (every 1 steps but the last: held-out "
        "on the first 2 of them) -> held-out (6 test tasks, greedy) after RL"
    )
