"""Typed run configurations: dataclass schemas, YAML presets and ``key=value`` overrides.

A training command resolves its configuration in three layers -- the dataclass defaults, a preset
(a registered name or a YAML path) and ``--set key=value`` overrides -- and writes the result next
to its outputs (``config.yaml``), as timm writes ``args.yaml``. Unknown keys and values that do not
fit a field's type are errors that name the key, never silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what to do."""


@dataclasses.dataclass(frozen=True)
class RenamedKey:
    """A configuration key that was renamed: the old name still loads, read as ``new`` (``convert``-ed).

    ``convert`` maps the old value to the new key's value (e.g. ``channels_last: true`` ->
    ``memory_format: channels_last``); ``None`` keeps the value as it is.
    """

    new: str
    convert: Callable[[Any], Any] | None = None


def upgrade_renamed_keys(config: Mapping[str, Any], renamed: Mapping[str, RenamedKey], source: str) -> dict[str, Any]:
    """A copy of ``config`` with every deprecated key of ``renamed`` read under its new name.

    Each old key found warns (``FutureWarning``, naming ``source``, the old and the new key) so that
    existing configs, runs and releases keep loading while their owners learn the new name. Giving both
    names with different values is a :class:`ConfigError`: neither can be dropped silently.
    """
    out = dict(config)
    for old, spec in renamed.items():
        if old not in out:
            continue
        value = out.pop(old)
        new_value = spec.convert(value) if spec.convert is not None else value
        if spec.new in out and out[spec.new] != new_value:
            raise ConfigError(
                f"{source}: the deprecated key {old!r} (read as {spec.new}={new_value!r}) and {spec.new}="
                f"{out[spec.new]!r} disagree; keep only {spec.new!r}"
            )
        warnings.warn(
            f"{source}: config key {old!r} is deprecated and was read as {spec.new}={new_value!r}; "
            f"rename it to {spec.new!r}", FutureWarning, stacklevel=3,
        )
        out[spec.new] = new_value
    return out


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


def _merge_dotted(base: Any, path: list[str], value: Any, full_key: str, source: str) -> dict[str, Any]:
    """``base`` (a mapping) with ``value`` set at the nested ``path``; intermediate mappings are created."""
    if base is None:
        base = {}
    if not isinstance(base, dict):
        raise ConfigError(f"override {full_key!r} (from {source}) sets an entry of {base!r}, which is not a mapping")
    merged = dict(base)
    head, rest = path[0], path[1:]
    if rest:
        child = merged.get(head, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {full_key!r} (from {source}): {head!r} holds {child!r}, not a mapping; "
                f"set {full_key.rsplit('.', len(rest))[0]}=VALUE instead"
            )
        merged[head] = _merge_dotted(child, rest, value, full_key, source)
    else:
        merged[head] = value
    return merged


def apply_updates(config: T, updates: dict[str, Any], source: str) -> T:
    """Return a copy of dataclass ``config`` with ``updates`` applied (type-checked).

    A dotted key (``model_overrides.patch_size``) sets one entry inside a mapping field and keeps the
    field's other entries (the preset's), where a plain key replaces the whole value. Keys apply in order,
    so a later update of the same key wins. ``source`` names where the updates came from, for errors.
    A schema's ``RENAMED_KEYS`` (``{old: RenamedKey}``) are read under their new names, with a warning.
    """
    updates = upgrade_renamed_keys(updates, getattr(type(config), "RENAMED_KEYS", {}), source)
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    changes: dict[str, Any] = {}
    for key, value in updates.items():
        name, dot, inner = key.partition(".")
        if name not in fields:
            raise ConfigError(f"unknown config key {name!r} in {source}; valid keys: {', '.join(sorted(fields))}")
        if dot:
            annotation = hints[name]
            if not (annotation is dict or typing.get_origin(annotation) is dict):
                raise ConfigError(
                    f"config key {key!r} in {source}: {name!r} is not a mapping, so it has no entries to set; "
                    f"use {name}=VALUE"
                )
            if not inner or any(not part for part in inner.split(".")):
                raise ConfigError(f"config key {key!r} in {source} has an empty part; write {name}.ENTRY=VALUE")
            current = changes.get(name, getattr(config, name))
            value = _merge_dotted(current, inner.split("."), value, key, source)
        try:
            changes[name] = _coerce(name, value, hints[name])
        except ConfigError as err:
            raise ConfigError(f"{err} (from {source})") from None
    return dataclasses.replace(config, **changes)


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``["lr=1e-4", "max_steps=10"]`` -> ``{"lr": 0.0001, "max_steps": 10}`` (values parsed as YAML).

    Keys may be dotted (``model_overrides.patch_size=4``, see :func:`apply_updates`); the order of
    ``pairs`` is kept, and a key given twice takes its last value.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r} is not key=value")
        key = key.strip()
        out.pop(key, None)  # re-insert so that the order of application is the order on the command line
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {pair}: the value is not valid YAML ({yaml_problem(err)}); quote it or fix "
                              "the brackets, e.g. --set 'betas=[0.9, 0.99]'") from None
    return out


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: what is wrong and where (line and column, 1-based)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def add_override_argument(parser: argparse.ArgumentParser, help_text: str = "override config keys") -> None:
    """``--set KEY=VALUE ...``, repeatable: ``--set a=1 --set b=2`` and ``--set a=1 b=2`` both apply both.

    ``action="extend"`` is what keeps earlier ``--set`` groups (with plain ``nargs`` argparse keeps only
    the last group and silently drops the rest).
    """
    parser.add_argument(
        "--set", dest="set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help=f"{help_text}; repeatable; dotted keys set one entry of a mapping (model_overrides.patch_size=4)",
    )


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; clear errors for missing files and non-mappings."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.constructor.ConstructorError as err:  # e.g. !!python/object: safe_load refuses it, nothing runs
        raise ConfigError(f"config file {path}: {yaml_problem(err)} (tags that build Python objects are refused; "
                          "write plain values)") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(err)}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text ({err})") from None
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
