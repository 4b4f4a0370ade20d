"""Build a validated ``Config`` from a preset or YAML file plus dotted ``key=value`` overrides.

Layering, later wins: schema defaults → the AlgoSpec named by ``algo_preset`` → the YAML chain
(a file may start from another preset with ``preset:``) → command-line overrides.
A YAML file holds only overrides, nested by group (``algo: {eps_high: 0.3}``) or dotted
(``algo.eps_high: 0.3``), plus the meta keys ``preset``, ``algo_preset``, ``description``, ``paper``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from reasonrl.algo.presets import PRESETS as ALGO_PRESETS
from reasonrl.config.config_error import ConfigError, listing
from reasonrl.config.ranges import finite_number
from reasonrl.config.schema import Config
from reasonrl.config.validate import validate

PRESET_DIR = Path(__file__).parent / "presets"
META_KEYS = ("preset", "algo_preset", "description", "paper", "status")


@dataclass(frozen=True)
class PresetInfo:
    """What ``reasonrl presets`` lists about a run preset."""

    name: str
    description: str
    paper: str
    path: Path
    status: str = ""
    """"experimental" until the preset reproduces its paper's claim on our benchmark; empty otherwise."""


@dataclass(frozen=True)
class _Layer:
    """One YAML file, split into its meta keys and its dotted overrides."""

    meta: dict[str, Any]
    overrides: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# keys


def _is_group(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def config_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every settable dotted key of the schema, e.g. ``algo.eps_high``."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_group(tp):
            keys.extend(config_keys(tp, f"{prefix}{f.name}."))
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _unknown_key(key: str) -> str:
    """What is wrong with a key the schema does not have, and the nearest one that it has."""
    keys = config_keys()
    members = [k for k in keys if k.startswith(f"{key}.")]
    if members:
        return f"'{key}' is a group of settings, not a value; set one of its fields, e.g. {members[0]}"
    guess = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not guess:  # the right name in the wrong group, e.g. rollout.eps_high
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
        close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
        guess = [by_leaf[close[0]]] if close else []
    hint = f"; did you mean '{guess[0]}'?" if guess else "; `reasonrl config show dapo` lists every key"
    return f"unknown config key '{key}'{hint}"


# ---------------------------------------------------------------------------------------------
# values


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0])}s"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


class NonFiniteError(ConfigError):
    """A number setting given NaN or an infinity."""


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; numbers given as strings (YAML's 1e-6) are parsed."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if type(None) in options and (value is None or (isinstance(value, str) and value.lower() == "none")):
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except NonFiniteError:
                raise
            except ConfigError:
                pass
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None:
            if not finite_number(number):  # no setting means anything at NaN, infinity or beyond float32
                raise NonFiniteError(f"{key}: expected a finite number, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        items = value if isinstance(value, list | tuple) else [value] if isinstance(value, int | float) else None
        if items is not None:
            item_type = typing.get_args(tp)[0]
            return tuple(_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(items))
    else:
        raise TypeError(f"{key}: unsupported annotation {tp!r} in the schema")
    raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")


def _build(cls: type, values: Mapping[str, Any], problems: list[str], prefix: str = "") -> Any:
    """Construct dataclass ``cls`` from a nested mapping, checking every value's type; a value of the wrong
    type keeps its default and adds its problem to ``problems``."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        tp, value, key = hints[f.name], values[f.name], f"{prefix}{f.name}"
        if _is_group(tp):
            if isinstance(value, Mapping):
                kwargs[f.name] = _build(tp, value, problems, f"{key}.")
            else:
                problems.append(f"{key} is a group of settings; give it as a mapping (e.g. {key}.<field>: ...)")
            continue
        try:
            kwargs[f.name] = _coerce(value, tp, key)
        except ConfigError as exc:
            problems.append(str(exc))
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass as a nested plain dict (YAML-friendly: tuples become lists)."""
    return dataclasses.asdict(
        cfg, dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v for k, v in items}
    )


def _apply(tree: dict[str, Any], key: str, value: Any) -> None:
    *groups, leaf = key.split(".")
    node = tree
    for group in groups:
        node = node[group]
    node[leaf] = value


def build_config(algo_preset: str | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the named AlgoSpec, then dotted overrides; validated.  Every unknown key and every
    value of the wrong type is reported at once (then the cross-field checks, which need them right)."""
    tree = to_dict(Config())
    if algo_preset is not None:
        if algo_preset not in ALGO_PRESETS:
            raise ConfigError(f"unknown algo_preset '{algo_preset}'; choose one of {', '.join(ALGO_PRESETS)}")
        tree["algo"] = to_dict(ALGO_PRESETS[algo_preset].spec)
    valid_keys = set(config_keys())
    problems = [_unknown_key(key) for key in (overrides or {}) if key not in valid_keys]
    for key, value in (overrides or {}).items():
        if key in valid_keys:
            _apply(tree, key, value)
    cfg = _build(Config, tree, problems)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise listing(problems)
    validate(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------
# files and presets


def _flatten(mapping: Mapping[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """Nested group mappings to dotted keys; leaves stay as they are (unknown keys are kept for the error)."""
    flat: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for key, value in mapping.items():
        head, _, rest = str(key).partition(".")
        tp = hints.get(head)
        if tp is not None and _is_group(tp) and (rest or isinstance(value, Mapping)):
            flat.update(_flatten({rest: value} if rest else value, tp, f"{prefix}{head}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _read_layer(path: Path) -> _Layer:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a mapping of settings, not a {type(data).__name__}")
    meta = {k: data[k] for k in META_KEYS if k in data}
    body = {k: v for k, v in data.items() if k not in META_KEYS}
    return _Layer(meta=meta, overrides=_flatten(body, Config))


def _preset_path(name: str) -> Path:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = [p.name for p in list_presets()]
        guess = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        raise ConfigError(f"unknown preset '{name}'; {hint}(presets: {', '.join(names)}; or a YAML file path)")
    return path


def _resolve_source(source: str | Path) -> Path:
    """A preset name or a path to a YAML file."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    return _preset_path(str(source))


def _layers(path: Path, seen: tuple[Path, ...] = ()) -> list[_Layer]:
    """The file's layer chain, base presets first."""
    if path.resolve() in seen:
        raise ConfigError(f"preset cycle: {' -> '.join(str(p) for p in (*seen, path))}")
    layer = _read_layer(path)
    base = layer.meta.get("preset")
    chain = _layers(_preset_path(base), (*seen, path.resolve())) if base else []
    return [*chain, layer]


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["algo.eps_high=0.3", "run.name=x"]`` -> dotted dict; values are parsed as YAML scalars."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. algo.eps_high=0.28)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        overrides[key.strip()] = value
    return overrides


def load_config(source: str | Path | None = None, overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """The validated Config for a preset name or YAML path (None = defaults) plus overrides."""
    algo_preset: str | None = None
    merged: dict[str, Any] = {}
    if source is not None:
        for layer in _layers(_resolve_source(source)):
            algo_preset = layer.meta.get("algo_preset", algo_preset)
            merged.update(layer.overrides)
    merged.update(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides))
    return build_config(algo_preset, merged)


def preset_info(path: Path) -> PresetInfo:
    """Name, description and paper of the run preset stored at ``path``."""
    meta = _read_layer(path).meta
    return PresetInfo(
        path.stem, str(meta.get("description", "")), str(meta.get("paper", "")), path, str(meta.get("status", ""))
    )


def list_presets() -> list[PresetInfo]:
    """The shipped run presets, sorted by name."""
    return [preset_info(p) for p in sorted(PRESET_DIR.glob("*.yaml"))]
