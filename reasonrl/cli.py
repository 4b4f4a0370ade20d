"""The ``reasonrl`` command line.

reasonrl presets                          list the run presets (name, description, paper)
reasonrl config show PRESET|FILE [k=v]    the fully resolved config and its derived plan
reasonrl config validate FILE [k=v]       check a config file; exit status 2 if it is invalid
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reasonrl import __version__
from reasonrl.config import ConfigError, list_presets, load_config, resolve
from reasonrl.config.render import render_yaml


def _cmd_presets(args: argparse.Namespace) -> int:
    presets = list_presets()
    width = max(len(p.name) for p in presets)
    for preset in presets:
        print(f"{preset.name:<{width}}  {preset.description}")
        print(f"{'':<{width}}  paper: {preset.paper}")
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.source, args.overrides)
    print(render_yaml(cfg, comments=args.docs), end="")
    print("# derived plan (reasonrl.config.resolve)")
    plan_yaml = render_yaml(resolve(cfg), comments=args.docs)
    print("\n".join(f"# {line}" if line else line for line in plan_yaml.splitlines()))
    return 0


def _cmd_config_validate(args: argparse.Namespace) -> int:
    plan = resolve(load_config(args.file, args.overrides))
    print(
        f"{args.file}: valid ({plan.sequences_per_rollout} responses and "
        f"{plan.optimizer_steps_per_rollout} optimiser steps per rollout step, "
        f"{plan.total_optimizer_steps} in all)"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``reasonrl`` command."""
    parser = argparse.ArgumentParser(prog="reasonrl", description="RL for reasoning language models.")
    parser.add_argument("--version", action="version", version=f"reasonrl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    presets = commands.add_parser("presets", help="list the run presets")
    presets.set_defaults(handler=_cmd_presets)

    config = commands.add_parser("config", help="show or validate configurations")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = config_commands.add_parser("show", help="print the fully resolved config and its plan")
    show.add_argument("source", help="a preset name (see `reasonrl presets`) or a YAML file")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. algo.eps_high=0.3")
    show.add_argument("--docs", action="store_true", help="annotate every field with its documentation")
    show.set_defaults(handler=_cmd_config_show)
    validate = config_commands.add_parser("validate", help="check a config file")
    validate.add_argument("file", help="a YAML config file")
    validate.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides")
    validate.set_defaults(handler=_cmd_config_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``reasonrl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
