"""``reasonrl train``: which run (a new one, or the latest / a given one resumed), its config, and how it
trains: in this process, under torchrun (every process runs this command; rank 0 speaks for the run)
or on Ray (``dist.backend=ray``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from reasonrl.config import Config, ConfigError, load_config
from reasonrl.errors import ReasonRLError

DEFAULT_PRESET = "dapo"
RANK_ERROR_GRACE_SECONDS = 20.0
"""How long another torchrun rank waits before it states the error that stops it: a run's error reaches
every rank at once and rank 0 says it (torchrun then stops the rest), so a rank still alive after this
wait had an error of its own."""


def main_rank() -> bool:
    """Not one of torchrun's other processes: under torchrun, rank 0 alone speaks for the run."""
    return os.environ.get("RANK", "0") == "0"


def new_run_dir(cfg: Config, preset: str) -> Path:
    """Where a new run of ``preset`` goes: ``run.output_dir/run.name``, by default ``<preset>-<time>``."""
    return Path(cfg.run.output_dir) / (cfg.run.name or f"{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def _latest_run(output_dir: Path, preset: str) -> Path | None:
    """The newest run directory of ``preset`` under ``output_dir`` that has a checkpoint."""
    from reasonrl.training.record.checkpoint import latest_checkpoint
    from reasonrl.training.record.rundir import RunRecord

    candidates = []
    for run_json in output_dir.glob("*/run.json"):
        record = RunRecord.read(run_json.parent)
        if record and record.preset == preset and latest_checkpoint(run_json.parent):
            candidates.append(run_json.parent)
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def _preset_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The positional preset, unless it is the first override (``train --resume DIR k=v``)."""
    if args.preset and "=" in args.preset:
        return None, [args.preset, *args.overrides]
    return args.preset, list(args.overrides)


def _resumed_config(run_dir: Path, preset: str | None, overrides: list[str]):
    """The recorded settings of ``run_dir`` plus ``overrides`` (which ``fit`` checks against
    ``RESUMABLE_KEYS``), and its preset; refuses a directory the command line cannot continue."""
    from reasonrl.training.record.rundir import CONFIG_FILE, RunRecord

    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a reasonrl run directory (no {CONFIG_FILE}); give the directory of a run")
    record = RunRecord.read(run_dir)
    if record is None:
        raise ConfigError(
            f"{run_dir} has no run.json (it was made by fit() from Python); resume it by calling fit() again "
            "with its config and run directory"
        )
    if record.custom:
        raise ConfigError(
            f"{run_dir} was trained from Python with a {' and '.join(record.custom)}, which the command line "
            f"cannot rebuild; resume it by calling {record.resume_command(run_dir)}"
        )
    if preset is not None and Path(preset).stem != record.preset:
        raise ConfigError(
            f"{run_dir} is a {record.preset} run, not {Path(preset).stem}; resume it without a preset: "
            f"reasonrl train --resume {run_dir} [KEY=VALUE ...]"
        )
    return load_config(run_dir / CONFIG_FILE, overrides), record.preset


def _say_if_finished(run_dir: Path, cfg: Config) -> bool:
    """Whether the run in ``run_dir`` already finished the steps ``cfg`` asks for (and exported them); if so,
    says so and how to train it longer (its last checkpoint keeps the optimiser state for that).  Settings
    a resume may not change are refused first, as ever."""
    from reasonrl.training.record.rundir import check_resumable, checkpoint_step, finished_steps, recorded_config

    done = finished_steps(run_dir)
    if done < cfg.train.rollout_steps:
        return False
    check_resumable(run_dir, recorded_config(run_dir), cfg, checkpoint_step(run_dir))
    if main_rank():
        print(
            f"reasonrl: {run_dir} is finished: all {done} steps (train.rollout_steps) are done and its model is in "
            f"{run_dir / 'final'}. To train it longer: reasonrl train --resume {run_dir} train.rollout_steps=N "
            f"(N > {done})",
            file=sys.stderr,
        )
    return True


def cmd_train(args: argparse.Namespace) -> int:
    from reasonrl.training.placement.cpu_threads import sleeping_openmp_threads

    sleeping_openmp_threads()  # before torch loads OpenMP: on a busy machine its idle threads sleep, not spin
    from reasonrl.data.source import check_sources
    from reasonrl.training.loop import fit
    from reasonrl.training.run_inputs import data_spec

    preset, overrides = _preset_and_overrides(args)
    run_dir = None
    if args.resume == "auto":
        cfg = load_config(preset or DEFAULT_PRESET, overrides)
        run_dir = _latest_run(Path(cfg.run.output_dir), Path(preset or DEFAULT_PRESET).stem)
    elif args.resume:
        run_dir = Path(args.resume)
    if run_dir is not None:
        cfg, preset = _resumed_config(run_dir, None if args.resume == "auto" else preset, overrides)
        if _say_if_finished(run_dir, cfg):
            return 0
    else:
        preset = preset or DEFAULT_PRESET
        cfg = load_config(preset, overrides)
        run_dir = new_run_dir(cfg, preset)
        preset = Path(preset).stem
    if cfg.dist.backend == "ray" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "dist.backend=ray starts its own trainer workers: run `reasonrl train` once, not under torchrun"
        )
    try:
        check_sources(data_spec(cfg))
        speaks = main_rank()
        if speaks:
            print(f"reasonrl: training {preset} on {cfg.model.name_or_path}; run directory {run_dir}", file=sys.stderr)
        if cfg.dist.backend == "ray":
            from reasonrl.dist.ray_training import fit_on_ray

            summary = fit_on_ray(cfg, run_dir, preset=preset, overrides=tuple(overrides), show_progress=args.progress)
        else:
            summary = fit(cfg, run_dir, preset=preset, overrides=tuple(overrides), show_progress=args.progress)
    except ConfigError:
        raise  # the settings' error: `reasonrl` prints it once, from rank 0
    except ReasonRLError as exc:  # the run's error: every rank says it (rank 0 first), without a traceback
        if not main_rank():
            time.sleep(RANK_ERROR_GRACE_SECONDS)
        where = "" if main_rank() else f" (rank {os.environ['RANK']})"
        print(f"reasonrl: error{where}: {exc}", file=sys.stderr)
        return exc.exit_status
    if not speaks:
        return 0
    run_dir = Path(summary["run_dir"])
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    if summary["eval_prompts"]:
        print(f"held-out accuracy: {before:.1%} before -> {after:.1%} after ({(after - before) * 100:+.1f} points)")
        print(f"  (greedy, {summary['eval_prompts']} prompts; accuracy = {summary['accuracy_means']})")
    else:
        print("held-out accuracy: not measured (no held-out prompt was evaluated)")
    print(f"wall time {summary['wall_seconds'] / 60:.1f} min, peak RSS {summary['peak_rss_gb']:.2f} GB")
    print(f"plot:    {run_dir / summary['plot']}")
    print(f"summary: {run_dir / 'summary.md'}")
    print(f"model:   {run_dir / summary['final_model']}")
    return 0
