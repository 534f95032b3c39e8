"""The config machinery: YAML presets and dotted ``key=value`` overrides turned into a tree of
dataclasses, and that tree written back as YAML.

Nothing here knows the run's sections: :mod:`fr_agents.config` declares them (``TrainConfig`` and
its dataclasses, each field with its help, choices and rule) and the rules that tie fields
together; this module is what reads any such tree, in four steps:

1. **Find and read a preset** (:func:`presets_dir`, :func:`list_presets`, :func:`read_preset`):
   a shipped preset's name or a YAML path gives a plain mapping; a name that is neither is
   refused with the closest preset names.
2. **Parse the overrides** (:func:`parse_overrides`): ``["trainer.steps=10"]`` becomes the nested
   mapping ``{"trainer": {"steps": "10"}}``; :func:`merge_overrides` lays it over the preset's
   mapping, one entry at a time, except where a whole mapping was given (``env.kwargs={...}``).
3. **Build the dataclasses** (:func:`build`): every key is looked up (an unknown one is refused
   with "did you mean" and the closest key's help), every value converted to the field's annotated
   type (:func:`_coerce`: text from the command line or a YAML value alike) and checked against the
   field's ``choices`` and ``rule``. Each refusal is a :class:`ConfigError` naming the dotted key.
4. **Write it back** (:func:`dump_config`, :func:`annotated_yaml`, :func:`to_dict`): the resolved
   config as YAML, plain for the run directory or with each value's help line for ``--dry-run``.

Only the standard library and PyYAML: ``fr_agents.config`` imports this module, never the other way.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration key or value is invalid. The message names the dotted key."""


# --------------------------------------------------------------------------- presets


def presets_dir() -> Path:
    """The folder of the YAML presets: ``configs/`` at the top of a checkout (editable installs and
    runs from the source tree read it in place), shipped in a wheel as the package data
    ``fr_agents/configs/`` (``setup.py`` maps the one folder onto that package), so a plain
    ``pip install`` has them too."""
    installed = Path(str(resources.files("fr_agents") / "configs"))
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parent.parent / "configs"


CONFIG_DIR = presets_dir()


def list_presets() -> list[str]:
    """Names of the YAML presets shipped with the package (``configs/``, see :func:`presets_dir`)."""
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
        f"preset: no preset or YAML file named '{preset_or_path}'.{hint} Presets: {', '.join(list_presets())}"
    )


def read_preset(preset_or_path: str, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping a preset (a shipped preset's name or a YAML path) holds, with ``preset`` set to
    the file's stem unless the file names it; ConfigError when the top level is not a mapping.

    ``extends: OTHER`` (a preset's name or a YAML path) makes a preset a variant of another: OTHER's
    mapping is read first (itself perhaps extending a third) and this file's entries are laid over
    it as overrides are (a nested mapping merges entry by entry), so a variant names only what
    differs. ``preset`` and ``description`` are the variant's own."""
    path = _preset_path(preset_or_path)
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    base_name = loaded.pop("extends", None)
    if base_name is not None:
        if not isinstance(base_name, str) or not base_name.strip():
            raise ConfigError(f"extends: {path} must name one preset or YAML file, got {base_name!r}")
        if path.resolve() in _seen:
            chain = " -> ".join(p.stem for p in (*_seen, path.resolve()))
            raise ConfigError(f"extends: {path} extends itself ({chain})")
        base = read_preset(base_name.strip(), (*_seen, path.resolve()))
        base.pop("preset", None)
        base.pop("description", None)
        loaded = merge_overrides(base, loaded)
    loaded.setdefault("preset", path.stem)
    return loaded


# --------------------------------------------------------------------------- overrides


class _Whole(dict):
    """A mapping given whole on the command line (``env.kwargs={...}``): it replaces, never merges."""


class _OverrideText(str):
    """A scalar as typed on the command line (``trainer.steps=10``). A typed field converts the text
    itself; an entry of a free-form mapping (``tasks.params.size=600``, ``env.kwargs.call_timeout=3``)
    has no type to convert to, so it is read as YAML, as the same line in a preset file would be."""


def _read_override_texts(value: Any) -> Any:
    """``value`` with every :class:`_OverrideText` inside it read as a YAML scalar."""
    if isinstance(value, _OverrideText):
        try:
            return yaml.safe_load(str(value)) if str(value).strip() else str(value)
        except yaml.YAMLError:
            return str(value)
    if isinstance(value, dict):
        return {k: _read_override_texts(v) for k, v in value.items()}
    return value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested mapping ``{"a": {"b": "1"}, "c": "x"}`` (the texts
    are :class:`_OverrideText`, so that entries of free-form mappings can be read as YAML).

    A value written as a whole mapping (``env.kwargs={}``) replaces the preset's mapping; a dotted
    key into one (``env.kwargs.answer_format=plain``) changes that entry only.
    """
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
        parsed: Any = _OverrideText(value)
        if value.startswith(("[", "{")):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as e:
                raise ConfigError(f"override '{item}': not valid YAML ({e})") from None
            if isinstance(parsed, dict):
                parsed = _Whole(parsed)
        elif value.lower() in ("null", "none", "~"):
            parsed = None
        cur[parts[-1]] = parsed
    return nested


def merge_overrides(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it (neither is changed): a nested mapping merges entry by
    entry, a mapping given whole (``env.kwargs={...}``) or any other value replaces."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and not isinstance(v, _Whole) and isinstance(out.get(k), dict):
            out[k] = merge_overrides(out[k], v)
        else:
            out[k] = dict(v) if isinstance(v, _Whole) else v
    return out


# --------------------------------------------------------------------------- building the dataclasses


def _type_name(tp: Any) -> str:
    """``int`` for ``int``; the printed form for an annotation without a name (``list[int]``)."""
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
        return _read_override_texts(dict(value))
    if tp is Any:
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _unknown_key(dotted: str, prefix: str, fields: dict[str, dataclasses.Field]) -> ConfigError:
    """The error for a key the section does not have: up to three close spellings ("did you
    mean"), the help line of the closest, and every key the section allows."""
    key = dotted[len(prefix) :]
    close = difflib.get_close_matches(key, list(fields), n=3)
    hint = ""
    if close:
        best = fields[close[0]].metadata.get("help", "")
        hint = f" Did you mean: {', '.join(prefix + c for c in close)}? ({prefix}{close[0]}: {best})"
    allowed = ", ".join(prefix + f for f in fields)
    return ConfigError(f"unknown config key '{dotted}'.{hint} Allowed keys: {allowed}")


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested mapping, checking every key, choice and rule."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise _unknown_key(dotted, prefix, fields)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build(tp, value or {}, dotted + ".")
            continue
        coerced = _coerce(dotted, value, tp)
        choices = fields[key].metadata.get("choices")
        if choices and coerced not in choices:
            raise ConfigError(
                f"{dotted}: invalid value {coerced!r}; allowed values: {', '.join(map(str, choices))}"
            )
        rule = fields[key].metadata.get("rule")
        if rule is not None and coerced is not None:
            try:
                rule(coerced)
            except ValueError as e:
                raise ConfigError(f"{dotted}: {e}") from None
        kwargs[key] = coerced
    return cls(**kwargs)


# --------------------------------------------------------------------------- writing back


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config dataclass ``cfg`` as nested plain dicts and lists (what YAML and JSON take)."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (``inf`` survives the round trip)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def annotated_yaml(cfg: Any) -> str:
    """The resolved config as YAML, every value followed by its help line (``--dry-run``)."""

    def scalar(value: Any) -> str:
        return (
            yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()
        )

    def section(obj: Any, indent: str) -> list[str]:
        hints = typing.get_type_hints(type(obj))
        lines: list[str] = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                lines.append(f"{indent}{f.name}:  # {f.metadata.get('help', '')}")
                lines += section(value, indent + "  ")
            else:
                text = f"{indent}{f.name}: {scalar(value)}"
                lines.append(f"{text:<48} # {f.metadata.get('help', '')}")
        return lines

    return "\n".join(section(cfg, ""))
