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
