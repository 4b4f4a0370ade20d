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
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from reasonrl.config import ConfigError, list_presets, load_config, resolve
from reasonrl.config.commands import (
    ContrastivePretrainRun,
    EvalSettings,
    OfflineSampleRun,
    PRMLabelRun,
    RewardModelRun,
    VLMBuildRun,
)
from reasonrl.config.docs import field_docs
from reasonrl.config.render import render_yaml
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


def _cmd_eval(args: argparse.Namespace) -> int:
    from reasonrl.config.schema import FireConfig
    from reasonrl.data.loaders import DataError
    from reasonrl.eval import run_eval
    from reasonrl.models.load import ModelError

    settings = EvalSettings(
        model=args.model,
        dataset=args.dataset,
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        prompt_template=args.template,
        seed=args.seed,
        fire=FireConfig(enabled=args.fire, temperature=args.fire_temperature, top_k=args.fire_top_k),
        question_field=args.question_field,
        answer_field=args.answer_field,
        samples=args.n,
        system_prompt=args.system_prompt,
        protocol=args.protocol,
        device=args.device,
        dtype=args.dtype,
        max_attempts=args.max_attempts,
        self_verify_bon=args.self_verify_bon,
        records=args.records,
        overrides=tuple(args.overrides),
    )
    try:
        result = run_eval(settings, progress=args.progress)
    except (DataError, ModelError) as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
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
    from reasonrl.hub import PushError, push_run

    try:
        report = push_run(
            Path(args.run), args.repo, checkpoint=args.checkpoint, private=args.private, dry_run=args.dry_run
        )
    except PushError as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0


def _print_summary(produce: Callable[[], dict]) -> int:
    """Run a data-producing command: its summary as JSON (status 0), or a bad-data or bad-model error (status 1)."""
    from reasonrl.data.loaders import DataError
    from reasonrl.models.load import ModelError

    try:
        summary = produce()
    except (DataError, ModelError) as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_rm_train(args: argparse.Namespace) -> int:
    from reasonrl.reward.training import run_reward_model_training

    settings = _settings_from_args(RewardModelRun, args)
    return _print_summary(lambda: run_reward_model_training(settings, progress=args.progress))


def _cmd_rm_pretrain(args: argparse.Namespace) -> int:
    from reasonrl.reward.contrastive import run_contrastive_pretraining

    if not args.contrastive:
        raise ConfigError("rm pretrain: say --contrastive (COCA's contrastive pretraining, the one method)")
    settings = _settings_from_args(ContrastivePretrainRun, args)
    return _print_summary(lambda: run_contrastive_pretraining(settings, progress=args.progress))


def _cmd_vlm_build(args: argparse.Namespace) -> int:
    from reasonrl.models.vlm_build import build_directory, build_vlm

    settings = _settings_from_args(VLMBuildRun, args)
    out = Path(settings.out) if settings.out else build_directory(settings)
    return _print_summary(lambda: build_vlm(settings, out, progress=args.progress))


def _cmd_data_select(args: argparse.Namespace) -> int:
    from reasonrl.data.select import run_selection

    return _print_summary(
        lambda: run_selection(
            args.candidates,
            args.base,
            Path(args.out),
            fraction=args.fraction,
            samples=args.samples,
            max_new_tokens=args.max_new_tokens,
            overrides=args.overrides,
            split=args.split,
            limit=args.limit,
            progress=args.progress,
        )
    )


def _cmd_data_bon(args: argparse.Namespace) -> int:
    from reasonrl.data.select import best_of_n_references

    options = {
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "overrides": args.overrides,
        "progress": args.progress,
    }
    return _print_summary(lambda: best_of_n_references(args.prompts, args.reward_model, Path(args.out), **options))


def _cmd_prm_label(args: argparse.Namespace) -> int:
    from reasonrl.reward.prm_label import run_labelling

    settings = _settings_from_args(PRMLabelRun, args)
    return _print_summary(lambda: run_labelling(settings, progress=args.progress))


def _cmd_data_sample(args: argparse.Namespace) -> int:
    from reasonrl.data.offline import run_sampling

    settings = _settings_from_args(OfflineSampleRun, args)
    return _print_summary(lambda: run_sampling(settings, progress=args.progress))


def _add_settings_arguments(parser: argparse.ArgumentParser, settings: type) -> None:
    """An option per field of a settings dataclass (``--field-name``), with its default, type, ``Literal``
    choices and the first sentence of its docstring; a tuple field is the positional KEY=VALUE overrides."""
    docs, hints, defaults = field_docs(settings), typing.get_type_hints(settings), settings()
    for item in dataclasses.fields(settings):
        hint, default = hints[item.name], getattr(defaults, item.name)
        help_text = docs.get(item.name, "").split(". ")[0].replace("%", "%%")
        if typing.get_origin(hint) is tuple:
            parser.add_argument(item.name, nargs="*", metavar="KEY=VALUE", help=help_text)
            continue
        kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)  # X | None -> X
        choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
        parser.add_argument(
            f"--{item.name.replace('_', '-')}", default=default, choices=choices,
            type=None if choices else kind, help=help_text,
        )  # fmt: skip


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
    values = {item.name: getattr(args, item.name) for item in dataclasses.fields(settings)}
    return settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _choices(settings: type, name: str) -> tuple[str, ...]:
    """The ``Literal`` choices of a settings field (of ``Literal[...] | None`` too)."""
    hint = typing.get_type_hints(settings)[name]
    literal = next((arg for arg in typing.get_args(hint) if typing.get_origin(arg) is typing.Literal), hint)
    return typing.get_args(literal)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``reasonrl`` command."""
    from reasonrl.data.loaders import builtin_names

    parser = argparse.ArgumentParser(prog="reasonrl", description="RL for reasoning language models.")
    parser.add_argument("--version", action="version", version=f"reasonrl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
        help="evaluate a model on a dataset",
        description="Evaluate a model on a dataset. Given a run directory, the options not given are the run's "
        "own (its held-out problems, fields, prompt, response cap and reward.functions), as its evaluation used.",
    )
    eval_defaults = EvalSettings()
    evaluate.add_argument(
        "--model", default=eval_defaults.model, help="model spec (as model.name_or_path) or a run directory"
    )
    evaluate.add_argument(
        "--dataset",
        default=eval_defaults.dataset,
        help=f"a built-in dataset ({', '.join(builtin_names(verifiable_only=True))}), a .jsonl/.parquet file "
        "with question/answer fields, or a hub id owner/name (default: a run's held-out problems, else arithmetic)",
    )
    evaluate.add_argument(
        "--question-field",
        default=eval_defaults.question_field,
        help="field of a file's rows holding the question (default: a run's data.question_field, else question)",
    )
    evaluate.add_argument(
        "--answer-field",
        default=eval_defaults.answer_field,
        help="field of a file's rows holding the final answer (default: a run's data.answer_field, else answer)",
    )
    evaluate.add_argument(
        "--k",
        type=int,
        default=eval_defaults.k,
        help="samples per problem for avg@k, maj@k, pass@k (greedy_pass@1 is greedy)",
    )
    evaluate.add_argument(
        "--n", type=int, default=eval_defaults.samples,
        help="samples drawn per problem (>= k; default k): pass@k is estimated from n",
    )  # fmt: skip
    evaluate.add_argument(
        "--system-prompt", default=eval_defaults.system_prompt,
        help="a system message before every prompt (default: a run's data.system_prompt, else none)",
    )  # fmt: skip
    evaluate.add_argument(
        "--temperature", type=float, default=eval_defaults.temperature, help="sampling temperature of the k samples"
    )
    evaluate.add_argument("--top-p", type=float, default=eval_defaults.top_p, help="nucleus threshold of the k samples")
    evaluate.add_argument(
        "--max-new-tokens", type=int, default=eval_defaults.max_new_tokens,
        help="cap on an answer's tokens (default: a run's rollout.max_response_tokens, else 256)",
    )  # fmt: skip
    evaluate.add_argument("--limit", type=int, default=eval_defaults.limit, help="evaluate the first N problems only")
    evaluate.add_argument(
        "--template", default=eval_defaults.prompt_template, choices=_choices(EvalSettings, "prompt_template"),
        help="how a question is asked (default: a run's data.prompt_template, else answer_line)",
    )  # fmt: skip
    evaluate.add_argument("--seed", type=int, default=eval_defaults.seed)
    evaluate.add_argument(
        "--device", default=eval_defaults.device, choices=_choices(EvalSettings, "device"),
        help="where the model generates: auto = a CUDA GPU when one is visible, else the CPU",
    )  # fmt: skip
    evaluate.add_argument("--dtype", default=eval_defaults.dtype, choices=_choices(EvalSettings, "dtype"))
    evaluate.add_argument("--fire", action="store_true", help="FIRE: sample the first token flaming-hot")
    evaluate.add_argument("--fire-temperature", type=float, default=eval_defaults.fire.temperature)
    evaluate.add_argument("--fire-top-k", type=int, default=eval_defaults.fire.top_k)
    evaluate.add_argument(
        "--protocol", default=eval_defaults.protocol, choices=_choices(EvalSettings, "protocol"),
        help="pag: also answer, self-verify and revise (PAG), reporting acc@t1, acc@final, verifier_accuracy",
    )  # fmt: skip
    evaluate.add_argument("--max-attempts", type=int, default=eval_defaults.max_attempts, help="PAG: answers at most")
    evaluate.add_argument(
        "--self-verify-bon", action="store_true",
        help="PAG self-verify best-of-k: keep the sampled answer the model's own verdict rates most likely correct",
    )  # fmt: skip
    evaluate.add_argument("--output", help="also write the JSON here")
    evaluate.add_argument(
        "--records", help="also write every greedy answer (id, response, tokens, score, verdict) to this .jsonl"
    )
    evaluate.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="reward.* settings as for train, e.g. \"reward.functions=['my_rewards.py:score']\" (default: a run's)",
    )  # fmt: skip
    _add_progress_options(evaluate)
    evaluate.set_defaults(handler=_cmd_eval)

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
    run.add_argument("--timeout", type=float, default=3.0, help="seconds per test case (wall clock and CPU)")
    run.add_argument("--total-timeout", type=float, default=None, help="seconds for the whole run")
    run.add_argument("--memory-mb", type=int, default=512, help="address-space limit of the code")
    run.add_argument("--one-process", action="store_true", help="one process for all tests (faster, less isolated)")
    run.set_defaults(handler=_cmd_sandbox_run)

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

    rm = commands.add_parser("rm", help="reward models")
    rm_commands = rm.add_subparsers(dest="rm_command", required=True, metavar="ACTION")
    rm_train = rm_commands.add_parser(
        "train",
        help="train a Bradley-Terry scorer or a pairwise judge on preference pairs, or a PRM on line labels; "
        "report held-out accuracy",
    )
    _add_settings_arguments(rm_train, RewardModelRun)
    _add_progress_options(rm_train)
    rm_train.set_defaults(handler=_cmd_rm_train)
    pretrain = rm_commands.add_parser(
        "pretrain", help="COCA contrastive pretraining of a reward-model / critic encoder on conversation histories"
    )
    pretrain.add_argument("--contrastive", action="store_true", help="contrastive pretraining (COCA, arXiv 2108.10510)")
    _add_settings_arguments(pretrain, ContrastivePretrainRun)
    _add_progress_options(pretrain)
    pretrain.set_defaults(handler=_cmd_rm_pretrain)

    vlm = commands.add_parser("vlm", help="vision-language models")
    vlm_build = vlm.add_subparsers(dest="vlm_command", required=True, metavar="ACTION").add_parser(
        "build", help="build a small VLM on a language model in Seed1.5-VL's stages (cached; smollm2-135m-vlm)"
    )
    _add_settings_arguments(vlm_build, VLMBuildRun)
    _add_progress_options(vlm_build)
    vlm_build.set_defaults(handler=_cmd_vlm_build)

    prm = commands.add_parser("prm", help="process rewards for code (arXiv 2410.17621)")
    prm_commands = prm.add_subparsers(dest="prm_command", required=True, metavar="ACTION")
    label = prm_commands.add_parser(
        "label", help="sample programs and label their lines by binary search over K completions (resumable)"
    )
    _add_settings_arguments(label, PRMLabelRun)
    _add_progress_options(label)
    label.set_defaults(handler=_cmd_prm_label)

    data = commands.add_parser("data", help="prepare training data")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    select = data_commands.add_parser(
        "select", help="Pre-PPO: keep the hardest candidate prompts (lowest in-domain z-score), merge into a base set"
    )
    select.add_argument("--candidates", required=True, help="candidate prompts: a dataset name or jsonl")
    select.add_argument("--base", help="the base prompt set the selection is merged into")
    select.add_argument("--out", required=True, help="the merged jsonl to write")
    select.add_argument("--fraction", type=float, default=0.1, help="share of candidates kept (paper: 10%%)")
    select.add_argument("--samples", type=int, default=4, help="responses sampled per candidate prompt")
    select.add_argument("--max-new-tokens", type=int, default=64)
    select.add_argument(
        "--split",
        default="auto",
        choices=["auto", "train", "test"],
        help="split of built-in datasets (auto: train where there is one, else the only split, e.g. math500's test)",
    )
    select.add_argument("--limit", type=int, default=None, help="score the first N candidates only")
    _add_progress_options(select)
    select.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides: model.name_or_path, reward.* ..."
    )
    select.set_defaults(handler=_cmd_data_select)
    bon = data_commands.add_parser(
        "bon",
        help="best-of-N references: sample N responses per prompt, keep the BT model's favourite (task_type open)",
    )
    bon.add_argument("--prompts", required=True, help="prompts: a dataset name or jsonl")
    bon.add_argument(
        "--reward-model", required=True, help="a Bradley-Terry model: the --out directory of `reasonrl rm train`"
    )
    bon.add_argument("--out", required=True, help="the jsonl to write")
    bon.add_argument("--n", type=int, default=4)
    bon.add_argument("--max-new-tokens", type=int, default=128)
    bon.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. model.name_or_path")
    _add_progress_options(bon)
    bon.set_defaults(handler=_cmd_data_bon)
    sample = data_commands.add_parser(
        "sample", help="offline dataset for dpo/dqo: n scored responses per prompt with behaviour log-probs (resumable)"
    )
    _add_settings_arguments(sample, OfflineSampleRun)
    _add_progress_options(sample)
    sample.set_defaults(handler=_cmd_data_sample)
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
    except ConfigError as exc:
        if main_rank():
            print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
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
