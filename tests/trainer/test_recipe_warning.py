"""A preset's recipe is tuned for one kind of model (``model.tuned_for``); run with the other kind,
the dry run and the run's log say so, naming the recipe's keys and the presets that fit.

Nothing here loads weights: the kind of model comes from its name and config.json
(:func:`fr_agents.models.model_kind`), so the check costs a dry run nothing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fr_agents.config import load_config
from fr_agents.models import model_kind, tiny_dir
from trainer.preflight import RECIPE_KEYS, dry_run_report, recipe_warning

TINY_RECIPE = (
    "optim.lr=0.0001",
    "rollout.temperature=1.0",
    "rollout.max_new_tokens=32",
    "rollout.max_context=64",
    "env.kwargs.answer_format=plain",
    "warm_start.examples=0",
)


def test_dry_run_of_math_tiny_with_smollm2_warns_naming_the_keys_and_the_fitting_presets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command that wrecked SmolLM2-135M in five steps now says why before it starts."""
    from trainer.loop import main_train

    main_train(
        "math-tiny",
        [
            "model.name=smollm2-135m",
            "warm_start.examples=0",
            "trainer.steps=5",
            "trainer.batch_size=16",
            "rollout.max_new_tokens=32",
        ],
        dry_run=True,
    )
    out = capsys.readouterr().out
    warning = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warning) == 1, out
    line = warning[0]
    assert (
        "preset math-tiny is tuned for the tiny model" in line
        and "model.name=smollm2-135m is a pretrained model" in line
    )
    for item in TINY_RECIPE:
        assert item in line, item
    # the presets tuned for a pretrained model on the same env, each with its model and device
    assert "Presets tuned for a pretrained model on fr_agents/MathVerifier-v0: " in line
    assert "math-qwen2.5-math-1.5b (model Qwen/Qwen2.5-Math-1.5B, cuda)" in line
    assert "math-smollm2 (model smollm2-135m, cpu)" in line  # the one a CPU user can run as it is
    assert "model.tuned_for=pretrained to declare it" in line


def test_math_tiny_with_the_tiny_model_has_no_warning() -> None:
    for overrides in ([], ["model.name=tiny-nano"], [f"model.name={tiny_dir('nano')}"]):
        cfg = load_config("math-tiny", overrides)
        assert recipe_warning(cfg) is None, overrides
        assert "WARNING" not in dry_run_report(cfg), overrides


def test_a_pretrained_preset_with_the_tiny_model_names_the_tiny_presets() -> None:
    why = recipe_warning(load_config("math-qwen2.5-math-1.5b", ["model.name=tiny"]))
    assert why is not None
    assert (
        "is tuned for a pretrained model (model.tuned_for=pretrained), but model.name=tiny is the tiny model"
        in why
    )
    assert (
        "optim.lr=1e-06" in why
        and "rollout.max_new_tokens=3072" in why
        and "env.kwargs.answer_format=boxed" in why
    )
    assert (
        "Presets tuned for the tiny model on fr_agents/MathVerifier-v0: " in why
        and "math-tiny (model tiny, cpu)" in why
    )


def test_no_fitting_preset_is_said_plainly() -> None:
    why = recipe_warning(load_config("repo-coding-tiny", ["model.name=smollm2-135m"]))
    assert why is not None and "No preset is tuned for a pretrained model on fr_agents/RepoCoding-v0" in why


def test_an_undeclared_or_redeclared_recipe_is_not_checked() -> None:
    assert recipe_warning(load_config("math-tiny", ["model.name=smollm2-135m", "model.tuned_for="])) is None
    assert (
        recipe_warning(load_config("math-tiny", ["model.name=smollm2-135m", "model.tuned_for=pretrained"]))
        is None
    )


def test_every_recipe_key_is_a_config_key() -> None:
    from fr_agents.config import field_help

    for key in RECIPE_KEYS:
        field_help(key if not key.startswith("env.kwargs.") else "env.kwargs")


def test_model_kind_reads_names_and_config_json_only(tmp_path: Path) -> None:
    assert model_kind("tiny") == model_kind("tiny-small") == "tiny"
    assert model_kind("smollm2-135m") == model_kind("SmolLM2") == "pretrained"
    assert model_kind("some-org/some-model-not-cached") == "pretrained"
    assert model_kind("no such model") is None
    assert model_kind(str(tiny_dir("nano"))) == "tiny"  # the build's marker file
    # a run's checkpoint of the tiny model: config.json alone, of a tiny size's shape
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = json.loads((tiny_dir("nano") / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config))
    assert model_kind(str(ckpt)) == "tiny"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 576, "num_hidden_layers": 30}))
    assert model_kind(str(other)) == "pretrained"


class _Built(Exception):
    """Raised in place of building the run's parts: the test stops there."""


def test_the_run_logs_the_warning_before_any_work(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Trainer.open_run`` warns first of all: before the model is loaded, evaluated or warm started."""
    from trainer.loop import Trainer

    def build(self: Trainer) -> None:
        raise _Built

    monkeypatch.setattr(Trainer, "build", build)
    cfg = load_config("math-tiny", ["model.name=smollm2-135m", "warm_start.examples=0"])
    with caplog.at_level(logging.WARNING, logger="trainer.preflight"), pytest.raises(_Built):
        Trainer(cfg, tmp_path, console=False).open_run(resume=False)
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.getMessage().startswith("recipe: ")
    ]
    assert len(warned) == 1 and "optim.lr=0.0001" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.preflight"), pytest.raises(_Built):
        Trainer(load_config("math-tiny"), tmp_path, console=False).open_run(resume=False)
    assert not [r for r in caplog.records if r.getMessage().startswith("recipe: ")]


def test_every_shipped_preset_declares_its_model_kind_and_fits_its_own_model() -> None:
    from fr_agents.config import list_presets

    for name in list_presets():
        cfg = load_config(name)
        assert cfg.model.tuned_for in ("tiny", "pretrained"), name
        assert recipe_warning(cfg) is None, name
