"""Typed run configuration: YAML presets plus dotted ``key=value`` overrides.

A run is described by one :class:`TrainConfig`, a tree of small dataclasses. Presets live in
``configs/*.yaml`` and name only what differs from the defaults here. On the command line,
``fr-agents train math-tiny trainer.batch_size=32 objective.delta=inf`` overrides single fields.

Every key is checked: an unknown key, a value of the wrong type, or a value outside a field's
``choices`` raises :class:`ConfigError` naming the dotted key (and the allowed values).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration key or value is invalid. The message names the dotted key."""


def _choices(*values: Any, **kw: Any) -> Any:
    return field(metadata={"choices": values}, **kw)


@dataclass
class ModelConfig:
    """Which policy model to train: ``tiny``, ``smollm2-135m``, a local HF directory or a hub id."""

    name: str = "tiny"
    dtype: str = _choices("float32", "bfloat16", "float16", "float64", default="float32")
    tiny_size: str = _choices("nano", "micro", "small", default="micro")
    tiny_seed: int = 0


@dataclass
class EnvConfig:
    """The gymnasium env id (ours, a user's ``module:Id``) and its keyword arguments."""

    id: str = "fr_agents/MathVerifier-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    max_turns: int = 1


@dataclass
class TasksConfig:
    """Where prompts come from (see ``envs.tasks``): a source name and its parameters.

    ``provider`` names the factory ``(source, seed=..., **params) -> TaskSource`` as a
    ``"module:attr"`` string, the way gymnasium names env entry points: the trainer resolves it at
    run time, so ``trainer`` never imports ``envs`` (data flows env -> rollout -> tree -> learner,
    never back) and users can plug in their own task provider.
    """

    provider: str = "envs.tasks:get_task_source"
    source: str = "arithmetic"
    params: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    seed: int = 0


@dataclass
class RolloutConfig:
    """How episodes are sampled."""

    engine: str = _choices("hf", "vllm", "openai", default="hf")
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    max_context: int = 512
    concurrency: int = 64
    branch_factor: int = 1
    branch_at: list[int] = field(default_factory=list)
    max_policy_lag: int = 2
    reward: str = _choices("env", "partial", default="env")
    turn_reward: str = _choices("sum", "last", default="sum")


@dataclass
class ObjectiveConfig:
    """The policy-gradient objective and its ablation switches."""

    algo: str = _choices("flashreinforce", "grpo", default="flashreinforce")
    delta: float = 3e-3
    importance_sampling: bool = True
    aggregation: str = _choices("sample_mean", "token_mean", default="sample_mean")
    negative_token_fraction: float = 1.0
    grpo_group_size: int = 4
    grpo_clip: float = 0.2


@dataclass
class OptimConfig:
    """Adam(W) settings."""

    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0
    warmup_steps: int = 0
    scheduler: str = _choices("constant", "linear", "cosine", default="constant")


@dataclass
class WarmStartConfig:
    """Optional supervised warm start on labelled demos before RL (reported separately)."""

    examples: int = 0
    epochs: int = 1
    lr: float = 1e-3
    batch_size: int = 32
    max_minutes: float = 0.0


@dataclass
class TrainerConfig:
    """The learner loop."""

    batch_size: int = 64
    steps: int = 100
    max_minutes: float = 0.0
    micro_batch_tokens: int = 8192
    max_per_root: int = 5
    packed: str = _choices("auto", "always", "never", default="auto")
    checkpoint_every: int = 25
    eval_every: int = 0
    eval_episodes: int = 200
    eval_k: int = 0  # >0: also avg@k of sampled replies every eval_every steps (fr_agents.eval.periodic)
    eval_bench: str = ""  # bench for eval_k (envs/benches.py names); "" = this config's test split
    eval_temperature: float = 1.0
    # "module:attr" of ``(cfg) -> Bench`` for eval_k (resolved at run time, like tasks.provider)
    eval_bench_provider: str = "envs.benches:eval_bench_for"
    collapse_guard: bool = True
    seed: int = 0
    backend: str = _choices("local", "ray", default="local")
    # elastic rollout/train device pools (trainer/elastic.py; local backend, hf engine, CPU slots)
    elastic: bool = False
    devices: int = 3  # slots in both pools together (elastic only)
    rollout_devices: int = 0  # slots that start in the rollout pool; 0 = devices - 1
    device: str = "cpu"
    threads: int = 0
    log_every: int = 1
    plot_every: int = 10
    keep_checkpoints: int = 2


@dataclass
class RunConfig:
    """Where the run writes (config.yaml, metrics.jsonl, checkpoints, plots)."""

    out_dir: str = "runs"
    name: str = ""


@dataclass
class TrainConfig:
    """Everything one ``fr-agents train`` run needs."""

    preset: str = ""
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunConfig = field(default_factory=RunConfig)


# --------------------------------------------------------------------------- conversion


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (from YAML or a ``key=value`` string) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # accepts "inf", "1e-3"
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is list:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else []
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = args or (Any,)
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested mapping, checking every key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=3)
            hint = f" Did you mean: {', '.join(prefix + c for c in close)}?" if close else ""
            allowed = ", ".join(prefix + f for f in fields)
            raise ConfigError(f"unknown config key '{dotted}'.{hint} Allowed keys: {allowed}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value or {}, dotted + ".")
            continue
        coerced = _coerce(dotted, value, tp)
        choices = fields[key].metadata.get("choices")
        if choices and coerced not in choices:
            raise ConfigError(
                f"{dotted}: invalid value {coerced!r}; allowed values: {', '.join(map(str, choices))}"
            )
        kwargs[key] = coerced
    obj = cls(**kwargs)
    return obj


def _validate(cfg: TrainConfig) -> None:
    """Cross-field checks that name the offending key."""

    def bad(key: str, why: str) -> None:
        raise ConfigError(f"{key}: {why}")

    d = cfg.objective.delta
    if math.isnan(d) or d < 0:
        bad("objective.delta", f"must be >= 0 (inf disables the trust region), got {d}")
    if not 0.0 <= cfg.objective.negative_token_fraction <= 1.0:
        bad("objective.negative_token_fraction", "must lie in [0, 1]")
    if cfg.trainer.batch_size < 1:
        bad("trainer.batch_size", "must be >= 1")
    if cfg.trainer.steps < 0:
        bad("trainer.steps", "must be >= 0")
    if cfg.rollout.temperature <= 0:
        bad("rollout.temperature", "must be > 0")
    if cfg.trainer.elastic:
        t = cfg.trainer
        if t.backend != "local":
            bad("trainer.elastic", f"elastic pools run on the local backend, not {t.backend!r}")
        if cfg.rollout.engine != "hf":
            bad("trainer.elastic", f"elastic pools need rollout.engine=hf (one model copy per slot), got {cfg.rollout.engine!r}")
        if t.devices < 2:
            bad("trainer.devices", f"elastic pools need >= 2 slots, got {t.devices}")
        if not 0 <= t.rollout_devices < t.devices:
            bad("trainer.rollout_devices", f"must lie in [0, {t.devices - 1}] (0 = devices - 1), got {t.rollout_devices}")
    if not 0 < cfg.rollout.top_p <= 1:
        bad("rollout.top_p", "must lie in (0, 1]")
    if cfg.rollout.max_policy_lag < 0:
        bad("rollout.max_policy_lag", "must be >= 0")
    if cfg.rollout.branch_factor < 1:
        bad("rollout.branch_factor", "must be >= 1")
    if cfg.rollout.max_new_tokens < 1:
        bad("rollout.max_new_tokens", "must be >= 1")
    if cfg.optim.lr <= 0:
        bad("optim.lr", "must be > 0")
    if cfg.objective.algo == "grpo" and cfg.objective.grpo_group_size < 2:
        bad("objective.grpo_group_size", "GRPO needs at least 2 samples per prompt")
    importance_on = cfg.objective.importance_sampling and cfg.objective.algo == "flashreinforce"
    if importance_on and (cfg.rollout.top_p < 1.0 or cfg.rollout.top_k > 0):
        bad(
            "rollout.top_p",
            "top-k/top-p truncation is not allowed while importance correction is on "
            "(set objective.importance_sampling=false or rollout.top_p=1.0 rollout.top_k=0)",
        )


# --------------------------------------------------------------------------- loading


def list_presets() -> list[str]:
    """Names of the YAML presets shipped in ``configs/``."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _preset_path(preset_or_path: str) -> Path:
    p = Path(preset_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidate = CONFIG_DIR / f"{preset_or_path}.yaml"
    if candidate.exists():
        return candidate
    close = difflib.get_close_matches(preset_or_path, list_presets(), n=3)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"preset: no preset or YAML file named '{preset_or_path}'.{hint} "
        f"Presets: {', '.join(list_presets())}"
    )


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested mapping ``{"a": {"b": "1"}, "c": "x"}``."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected key=value (for example trainer.steps=10)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        cur = nested
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
            if not isinstance(cur, dict):
                raise ConfigError(f"override '{item}': '{part}' is not a section")
        parsed: Any = value
        if value.startswith(("[", "{")):
            parsed = yaml.safe_load(value)
        elif value.lower() in ("null", "none", "~"):
            parsed = None
        cur[parts[-1]] = parsed
    return nested


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("kwargs", "params"):
            out[k] = _merge(out[k], v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    cfg = _build(TrainConfig, data)
    _validate(cfg)
    return cfg


def load_config(preset_or_path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load a preset (name in ``configs/`` or a YAML path), apply overrides, validate."""
    data: dict[str, Any] = {}
    if preset_or_path:
        path = _preset_path(preset_or_path)
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
        data.setdefault("preset", path.stem)
    data = _merge(data, parse_overrides(overrides or []))
    return config_from_dict(data)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (``inf`` survives the round trip)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
