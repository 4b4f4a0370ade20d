"""Typed configuration: schema, loading with overrides, validation and the derived Plan."""

from reasonrl.config.config_error import ConfigError
from reasonrl.config.config_loader import build_config, list_presets, load_config, parse_overrides, to_dict
from reasonrl.config.plan import Plan, resolve
from reasonrl.config.schema import Config

__all__ = [
    "Config",
    "ConfigError",
    "Plan",
    "build_config",
    "list_presets",
    "load_config",
    "parse_overrides",
    "resolve",
    "to_dict",
]
