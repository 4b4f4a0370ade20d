"""The ``reasonrl`` command line.

reasonrl train [PRESET|FILE] [k=v ...]     an RL run (default preset: dapo); --resume RUN_DIR continues one
reasonrl eval --model M --dataset D --k N  greedy pass@1, avg@k, maj@k, pass@k of a model on a dataset
                                           (M a run directory: by default its own dataset, fields and rewards)
reasonrl presets                           list the run presets (name, description, paper)
reasonrl config show PRESET|FILE [k=v]     the fully resolved config and its derived plan
reasonrl config validate FILE [k=v]        check a config file; exit status 2 if it is invalid
reasonrl sandbox run SOLUTION --tests TESTS run a solution against assert-style tests in the sandbox (JSON verdict)
reasonrl push RUN_DIR --repo ID            upload a run's model with a generated model card to the Hugging Face Hub
reasonrl prm label --dataset mbpp --out F  label program lines by binary search (process rewards for code)
reasonrl data sample --dataset D --out F   an offline dataset for `train dpo` / `train dqo` (data.offline_path)
reasonrl rm pretrain --contrastive         COCA contrastive pretraining of a reward-model / critic encoder
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from reasonrl import jobs
from reasonrl.config import ConfigError, list_presets, load_config, resolve
from reasonrl.config.docs import field_docs
from reasonrl.config.ranges import finite_number
from reasonrl.config.render import render_yaml
from reasonrl.errors import ReasonRLError
from reasonrl.train_command import DEFAULT_PRESET, cmd_train, main_rank
from reasonrl.version import __version__


def _cmd_presets(args: argparse.Namespace) -> int:
    presets = list_presets()
    width = max(len(p.name) for p in presets)
    for preset in presets:
        status = f"[{preset.status}] " if preset.status else ""
        print(f"{preset.name:<{width}}  {status}{preset.description}")
        print(f"{'':<{width}}  paper: {preset.paper}")
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.source, args.overrides)
    print(render_yaml(cfg, comments=args.docs), end="")
    print("# derived plan (reasonrl.config.resolve)")
    plan_yaml = render_yaml(resolve(cfg), comments=args.docs)
    print("\n".join(f"# {line}" if line else line for line in plan_yaml.splitlines()))
    from reasonrl.models.memory_check import memory_plan_of

    memory = memory_plan_of(cfg)
    print("# memory plan (reasonrl.models.memory_plan): predicted peak per device, from the model's config")
    print("\n".join(f"# {line}" for line in (memory if isinstance(memory, str) else memory.table()).splitlines()))
    return 0


def _cmd_config_validate(args: argparse.Namespace) -> int:
    if args.file is None or "=" in args.file:  # none given, or a KEY=VALUE where the file belongs
        raise ConfigError(
            "config validate checks a config file: reasonrl config validate FILE [KEY=VALUE ...], e.g. "
            "`reasonrl config validate my_run.yaml train.rollout_steps=20`. A file holds what it changes from a "
            "preset, e.g. `preset: dapo` and `train: {rollout_steps: 20}`; `reasonrl config show dapo --docs` "
            "lists every setting"
        )
    plan = resolve(load_config(args.file, args.overrides))
    print(
        f"{args.file}: valid ({plan.sequences_per_rollout} responses and "
        f"{plan.optimizer_steps_per_rollout} optimiser steps per rollout step, "
        f"{plan.total_optimizer_steps} in all)"
    )
    return 0


def _cmd_sandbox_run(args: argparse.Namespace) -> int:
    from reasonrl.reward.sandbox import SandboxLimits, run_code

    try:
        solution, tests = Path(args.solution).read_text(), Path(args.tests).read_text()
        context = Path(args.context).read_text() if args.context else ""
    except OSError as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
    limits = SandboxLimits(timeout_s=args.timeout, total_timeout_s=args.total_timeout, memory_mb=args.memory_mb)
    verdict = run_code(solution, tests, args.entry_point, context, limits, not args.one_process)
    print(json.dumps(verdict.to_dict(), indent=2))
    return 0 if verdict.passed else 1


def _cmd_push(args: argparse.Namespace) -> int:
    from reasonrl.jobs.push import push_run

    report = push_run(Path(args.run), args.repo, checkpoint=args.checkpoint, private=args.private, dry_run=args.dry_run)
    print(json.dumps(report, indent=2))
    return 0


def _print_summary(produce: Callable[[], dict], output: str | None = None) -> int:
    """Run a data-producing command: its summary as JSON (status 0; also written to ``output``); its errors
    (bad data, a model that cannot load: status 1) are ``main``'s to print."""
    summary = produce()
    text = json.dumps(summary, indent=2)
    print(text)
    if output:
        Path(output).write_text(text + "\n")
    return 0


Job = Callable[[], tuple[type, Callable[..., dict]]]
"""A side command's job, one of ``reasonrl.jobs``'s: (its settings class, its run function), imported when called."""


def _cmd_job(args: argparse.Namespace) -> int:
    """Run a side job with the settings its options give; its summary is printed (and written to ``--output``,
    where the command has one)."""
    settings, run = args.job()
    chosen = _settings_from_args(settings, args)
    return _print_summary(lambda: run(chosen, progress=args.progress), getattr(args, "output", None))


def _cmd_rm_pretrain(args: argparse.Namespace) -> int:
    if not args.contrastive:
        raise ConfigError("rm pretrain: say --contrastive (COCA's contrastive pretraining, the one method)")
    return _cmd_job(args)


class _CommandParser(argparse.ArgumentParser):
    """A (sub-)command's parser.  A side job's options (``job``) come from its settings class, added the first
    time the parser parses or prints help: a job's module imports torch, which the other commands never wait
    for."""

    def __init__(self, *args, job: Job | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pending_job = job  # whose options are not added yet
        if job is not None:
            self.set_defaults(handler=_cmd_job, job=job)
            _add_progress_options(self)

    def _add_job_options(self) -> None:
        if self._pending_job is not None:
            settings, self._pending_job = self._pending_job()[0], None
            _add_settings_arguments(self, settings)

    def parse_known_args(self, args=None, namespace=None):
        self._add_job_options()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._add_job_options()
        return super().format_help()


FIRST_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s")  # where a field docstring's first sentence, its help, ends


def _option(item: dataclasses.Field) -> str:
    """The option (its argparse ``dest``) of a settings field: its name, or the ``option`` its metadata names."""
    return item.metadata.get("option", item.name)


def _add_settings_arguments(parser: argparse.ArgumentParser, settings: type) -> None:
    """An option per field of a settings dataclass (``--field-name``, or ``--OPTION`` where the field's metadata
    names one), with its default (a field without one is a required option), type, ``Literal`` choices and the
    first sentence of its docstring; a bool field is a flag; a tuple field is the positional KEY=VALUE overrides."""
    docs, hints = field_docs(settings), typing.get_type_hints(settings)
    for item in dataclasses.fields(settings):
        hint, flag = hints[item.name], f"--{_option(item).replace('_', '-')}"
        help_text = FIRST_SENTENCE_END.split(docs.get(item.name, ""), maxsplit=1)[0].replace("%", "%%")
        if typing.get_origin(hint) is tuple:
            parser.add_argument(_option(item), nargs="*", metavar="KEY=VALUE", help=help_text)
            continue
        if hint is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        given = {"required": True} if item.default is dataclasses.MISSING else {"default": item.default}
        kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)  # X | None -> X
        literal = next((t for t in (hint, kind) if typing.get_origin(t) is typing.Literal), None)
        choices = typing.get_args(literal) if literal else None
        kind = finite_float if kind is float else kind
        parser.add_argument(flag, **given, choices=choices, type=None if choices else kind, help=help_text)


def finite_float(text: str) -> float:
    """A number option's value: a finite float (argparse's ``float`` takes "nan" and "inf")."""
    value = float(text)
    if not finite_number(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _add_progress_options(parser: argparse.ArgumentParser) -> None:
    """The progress options every long command shares (``reasonrl.timing.Progress``): a live bar on stderr
    when it is a terminal; ``--progress`` also elsewhere (plain lines), ``--quiet`` never. stdout keeps the
    command's output alone either way."""
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress", dest="progress", action="store_const", const=True, default=None,
        help="show progress on stderr also off a terminal (plain lines; train writes a line per step anyway)",
    )  # fmt: skip
    shown.add_argument("--quiet", dest="progress", action="store_const", const=False, help="no progress on stderr")


def _settings_from_args(settings: type, args: argparse.Namespace):
    """The settings dataclass ``_add_settings_arguments`` described, filled from the parsed options."""
    values = {item.name: getattr(args, _option(item)) for item in dataclasses.fields(settings)}
    return settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _add_train_parser(commands) -> None:
    """`reasonrl train` (and `reasonrl eval`, which evaluates what it trains)."""
    from reasonrl.data.loaders import builtin_names

    train = commands.add_parser("train", help="run RL training")
    train.add_argument("preset", nargs="?", help=f"a preset name or YAML file (default: {DEFAULT_PRESET})")
    train.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.rollout_steps=10"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR|auto",
        help="continue a run from its latest checkpoint: a run directory, or auto (the newest run of the preset)",
    )
    _add_progress_options(train)
    train.set_defaults(handler=cmd_train)

    evaluate = commands.add_parser(
        "eval",
        job=jobs.evaluate_job,
        help="evaluate a model on a dataset",
        description="Evaluate a model on a dataset. Given a run directory, the options not given are the run's "
        "own (its held-out problems, fields, prompt, response cap and reward.functions), as its evaluation used.",
        epilog=f"built-in datasets: {', '.join(builtin_names(verifiable_only=True))}",
    )
    evaluate.add_argument("--output", help="also write the JSON here")


def _add_config_parsers(commands) -> None:
    """`reasonrl presets` and `reasonrl config show|validate`."""
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
    validate.add_argument("file", nargs="?", metavar="FILE", help="a YAML config file (or a preset name)")
    validate.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides")
    validate.set_defaults(handler=_cmd_config_validate)


def _add_sandbox_parser(commands) -> None:
    """`reasonrl sandbox run`: untrusted code against tests, as the reward runs it."""
    sandbox = commands.add_parser("sandbox", help="run untrusted code against tests in the sandbox")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    run = sandbox_commands.add_parser(
        "run",
        help="run SOLUTION.py against TESTS.py; print the JSON verdict (exit status 0 if every test passed, else 1)",
    )
    run.add_argument("solution", help="the Python file under test")
    run.add_argument(
        "--tests", required=True, help="assert lines, and/or HumanEval's def check(candidate) + check(name)"
    )
    run.add_argument("--entry-point", help="the function under test (what check(candidate) receives)")
    run.add_argument("--context", help="task code run before the solution and as trusted helpers of the tests")
    run.add_argument("--timeout", type=finite_float, default=3.0, help="seconds per test case (wall clock and CPU)")
    run.add_argument("--total-timeout", type=finite_float, default=None, help="seconds for the whole run")
    run.add_argument("--memory-mb", type=int, default=512, help="address-space limit of the code")
    run.add_argument("--one-process", action="store_true", help="one process for all tests (faster, less isolated)")
    run.set_defaults(handler=_cmd_sandbox_run)


def _add_push_parser(commands) -> None:
    """`reasonrl push`: a run's model to the Hugging Face Hub."""
    push = commands.add_parser(
        "push", help="upload a run's model, a generated model card and the run's record to the Hugging Face Hub"
    )
    push.add_argument("run", metavar="RUN_DIR", help="a reasonrl run directory")
    push.add_argument("--repo", required=True, metavar="ID", help="the model repository, e.g. me/smollm2-dapo")
    push.add_argument(
        "--checkpoint", metavar="latest|step-N", help="push this checkpoint instead of the final model (final/)"
    )
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--dry-run", action="store_true", help="print the files and model card; upload nothing")
    push.set_defaults(handler=_cmd_push)


def _add_side_job_parsers(commands) -> None:
    """The side jobs (``reasonrl.jobs``): reward models, a VLM, PRM labels, data."""
    rm = commands.add_parser("rm", help="reward models")
    rm_commands = rm.add_subparsers(dest="rm_command", required=True, metavar="ACTION")
    rm_commands.add_parser(
        "train",
        job=jobs.reward_model_job,
        help="train a Bradley-Terry scorer or a pairwise judge on preference pairs, or a PRM on line labels; "
        "report held-out accuracy",
    )
    pretrain = rm_commands.add_parser(
        "pretrain",
        job=jobs.contrastive_pretrain_job,
        help="COCA contrastive pretraining of a reward-model / critic encoder on conversation histories",
    )
    pretrain.add_argument("--contrastive", action="store_true", help="contrastive pretraining (COCA, arXiv 2108.10510)")
    pretrain.set_defaults(handler=_cmd_rm_pretrain)

    vlm = commands.add_parser("vlm", help="vision-language models")
    vlm.add_subparsers(dest="vlm_command", required=True, metavar="ACTION").add_parser(
        "build",
        job=jobs.vlm_build_job,
        help="build a small VLM on a language model in Seed1.5-VL's stages (cached; smollm2-135m-vlm)",
    )

    prm = commands.add_parser("prm", help="process rewards for code (arXiv 2410.17621)")
    prm.add_subparsers(dest="prm_command", required=True, metavar="ACTION").add_parser(
        "label",
        job=jobs.prm_label_job,
        help="sample programs and label their lines by binary search over K completions (resumable)",
    )

    data = commands.add_parser("data", help="prepare training data")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    data_commands.add_parser(
        "select",
        job=jobs.select_prompts_job,
        help="Pre-PPO: keep the hardest candidate prompts (lowest in-domain z-score), merge into a base set",
    )
    data_commands.add_parser(
        "bon",
        job=jobs.best_of_n_job,
        help="best-of-N references: sample N responses per prompt, keep the BT model's favourite (task_type open)",
    )
    data_commands.add_parser(
        "sample",
        job=jobs.offline_sample_job,
        help="offline dataset for dpo/dqo: n scored responses per prompt with behaviour log-probs (resumable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``reasonrl`` command."""
    parser = _CommandParser(prog="reasonrl", description="RL for reasoning language models.")
    parser.add_argument("--version", action="version", version=f"reasonrl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train_parser, _add_config_parsers, _add_sandbox_parser, _add_push_parser, _add_side_job_parsers):
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``reasonrl`` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]  # KEY=VALUE after an option (`--resume DIR k=v`) is an override
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _configure_logging()
    try:
        return args.handler(args)
    except ReasonRLError as exc:  # bad settings (status 2), bad data, a model that cannot load, ... (status 1)
        if main_rank():
            print(f"reasonrl: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt as exc:  # a run says where it stopped and how to resume (TrainingInterrupted)
        if main_rank():
            print(f"reasonrl: {str(exc) or 'interrupted'}", file=sys.stderr)
        return 130


def _configure_logging() -> None:
    from rich.logging import RichHandler

    from reasonrl.timing import stderr_console

    logging.basicConfig(
        level=logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=stderr_console(), show_time=False, show_path=False)],
        force=True,
    )
    # notices (resuming, checkpoint sizes) from rank 0; errors from every rank
    logging.getLogger("reasonrl").setLevel(logging.INFO if main_rank() else logging.ERROR)
    # huggingface_hub prints its warnings with a handler of its own; passed on here too, each would print twice
    logging.getLogger("huggingface_hub").propagate = False


if __name__ == "__main__":
    sys.exit(main())
