"""Typed configuration: presets load and validate; bad keys and values are named."""

from __future__ import annotations

import math

import pytest
import yaml

from fr_agents.config import (
    CONFIG_DIR,
    ConfigError,
    TrainConfig,
    config_from_dict,
    dump_config,
    list_presets,
    load_config,
    parse_overrides,
)


def test_presets_exist_and_include_the_default() -> None:
    assert "math-tiny" in list_presets()


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_loads_and_validates(preset: str) -> None:
    raw = yaml.safe_load((CONFIG_DIR / f"{preset}.yaml").read_text())
    assert isinstance(raw, dict), preset
    cfg = load_config(preset)
    assert isinstance(cfg, TrainConfig)
    assert cfg.preset == preset


def test_overrides_are_typed() -> None:
    cfg = load_config("math-tiny", ["trainer.batch_size=8", "objective.delta=inf", "optim.betas=[0.8,0.99]"])
    assert cfg.trainer.batch_size == 8
    assert math.isinf(cfg.objective.delta)
    assert cfg.optim.betas == [0.8, 0.99]


def test_unknown_key_is_named_with_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.batch_sise.*Did you mean: trainer\.batch_size"):
        load_config("math-tiny", ["trainer.batch_sise=8"])


def test_bad_value_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError, match=r"objective\.algo.*allowed values: flashreinforce, grpo"):
        load_config("math-tiny", ["objective.algo=ppo"])
    with pytest.raises(ConfigError, match=r"trainer\.batch_size: expected an integer"):
        load_config("math-tiny", ["trainer.batch_size=many"])
    with pytest.raises(ConfigError, match=r"objective\.delta"):
        load_config("math-tiny", ["objective.delta=-1"])


def test_unknown_section_and_malformed_override() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'optimiser'"):
        config_from_dict({"optimiser": {"lr": 1}})
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["trainer.steps"])


def test_truncated_sampling_refused_with_importance_correction() -> None:
    with pytest.raises(ConfigError, match="rollout.top_p"):
        load_config("math-tiny", ["rollout.top_p=0.9"])
    cfg = load_config("math-tiny", ["rollout.top_p=0.9", "objective.importance_sampling=false"])
    assert cfg.rollout.top_p == 0.9


def test_unknown_preset_suggests(tmp_path) -> None:
    with pytest.raises(ConfigError, match="math-tiny"):
        load_config("math-tiyn")


def test_resolved_config_round_trips(tmp_path) -> None:
    cfg = load_config("math-tiny", ["objective.delta=inf"])
    path = tmp_path / "config.yaml"
    dump_config(cfg, path)
    again = load_config(str(path))
    assert again == cfg


def test_a_preset_that_extends_another_names_only_what_differs(tmp_path) -> None:
    """``extends: OTHER``: OTHER's mapping first, the variant's entries laid over it entry by entry
    (a nested mapping merges); ``preset`` and ``description`` are the variant's."""
    base = tmp_path / "base.yaml"
    base.write_text(
        "description: the base\ntrainer: {batch_size: 8, steps: 3}\nrollout: {temperature: 0.5}\n"
    )
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"extends: {base}\ntrainer: {{steps: 7}}\n")
    cfg = load_config(str(variant))
    assert (cfg.trainer.batch_size, cfg.trainer.steps, cfg.rollout.temperature) == (8, 7, 0.5)
    assert cfg.preset == "variant" and cfg.description == ""
    again = tmp_path / "again.yaml"  # a variant of a variant
    again.write_text(f"extends: {variant}\ndescription: twice\nrollout: {{temperature: 0.9}}\n")
    cfg = load_config(str(again), ["trainer.steps=2"])
    assert (cfg.trainer.batch_size, cfg.trainer.steps, cfg.rollout.temperature) == (8, 2, 0.9)
    assert (cfg.preset, cfg.description) == ("again", "twice")


def test_a_preset_extending_itself_or_nothing_is_refused_by_name(tmp_path) -> None:
    loop_a, loop_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    loop_a.write_text(f"extends: {loop_b}\n")
    loop_b.write_text(f"extends: {loop_a}\n")
    with pytest.raises(ConfigError, match=r"extends: .*a\.yaml extends itself \(a -> b -> a\)"):
        load_config(str(loop_a))
    empty = tmp_path / "empty.yaml"
    empty.write_text("extends: [a, b]\n")
    with pytest.raises(ConfigError, match="extends: .* must name one preset"):
        load_config(str(empty))
    missing = tmp_path / "missing.yaml"
    missing.write_text("extends: math-tinny\n")
    with pytest.raises(ConfigError, match="Did you mean: math-tiny"):
        load_config(str(missing))
