"""Typed run configurations: dataclass schemas, YAML presets and ``key=value`` overrides.

A training command resolves its configuration in three layers -- the dataclass defaults, a preset
(a registered name or a YAML path) and ``--set key=value`` overrides -- and writes the result next
to its outputs (``config.yaml``), as timm writes ``args.yaml``. Unknown keys and values that do not
fit a field's type are errors that name the key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what to do."""


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(name, value, arg)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError("; ".join(errors))
    if annotation is Any:
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {name!r} needs a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length: tuple[float, float]
            if len(value) != len(args):
                raise ConfigError(f"config key {name!r} needs {len(args)} values, got {len(value)}: {list(value)!r}")
            return tuple(_coerce(name, v, a) for v, a in zip(value, args))
        inner = args[0] if args else Any
        items = [_coerce(name, v, inner) for v in value]
        return tuple(items) if origin is tuple else items
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"config key {name!r} needs true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"config key {name!r} needs an integer, got {value!r}")
        try:
            number = float(value)
        except ValueError as err:
            raise ConfigError(f"config key {name!r} needs an integer, got {value!r}") from err
        if number != int(number):
            raise ConfigError(f"config key {name!r} needs an integer, got {value!r}")
        return int(number)
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"config key {name!r} needs a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"config key {name!r} needs a number, got {value!r}") from err
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key {name!r} needs a string, got {value!r}")
        return str(value)
    if annotation is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {name!r} needs a mapping, got {value!r}")
        return dict(value)
    return value


def apply_updates(config: T, updates: dict[str, Any], source: str) -> T:
    """Return a copy of dataclass ``config`` with ``updates`` applied (type-checked).

    ``source`` names where the updates came from, for error messages.
    """
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for key, value in updates.items():
        if key not in fields:
            raise ConfigError(f"unknown config key {key!r} in {source}; valid keys: {', '.join(sorted(fields))}")
        try:
            changes[key] = _coerce(key, value, hints[key])
        except ConfigError as err:
            raise ConfigError(f"{err} (from {source})") from None
    return dataclasses.replace(config, **changes)


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``["lr=1e-4", "max_steps=10"]`` -> ``{"lr": 0.0001, "max_steps": 10}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r} is not key=value")
        out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; clear errors for missing files and non-mappings."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a key: value mapping, got {type(data).__name__}")
    return data


def resolve_config(
    schema: type[T], preset: str, presets_dir: Path, overrides: list[str] | None = None
) -> T:
    """Defaults of ``schema`` <- preset (name in ``presets_dir`` or a YAML path) <- ``key=value`` overrides."""
    candidate = presets_dir / f"{preset}.yaml"
    if candidate.is_file():
        path = candidate
    elif Path(preset).is_file():
        path = Path(preset)
    else:
        names = sorted(p.stem for p in presets_dir.glob("*.yaml"))
        raise ConfigError(f"no config preset or file {preset!r}; presets: {', '.join(names)}")
    config = apply_updates(schema(), load_yaml(path), str(path))
    return apply_updates(config, parse_overrides(overrides), "--set")


def save_config(config: Any, path: str | Path) -> None:
    """Write a dataclass config as YAML (tuples become lists)."""
    data = dataclasses.asdict(config)
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=True))
