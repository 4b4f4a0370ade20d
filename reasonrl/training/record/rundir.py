"""A run directory owns its identity: what runs in it, who runs it, and what a stopped run kept.

- ``run.json`` records how the run was made (preset, overrides, objects handed to ``fit()`` that no
  command line can rebuild) and ``config.yaml`` its full settings.  Both are written when the run
  starts and kept by every resume: the summary's "Reproduce" line stays true.
- ``run.lock`` is held (``fcntl.flock``) while a run is live: a second run into the same directory
  refuses, naming the live run's pid.  The kernel drops the lock when its process dies, so a run
  killed with ``kill -9`` leaves no stale lock.
- A run into a directory that already holds one continues it, with the recorded settings: only the
  ``RESUMABLE_KEYS`` may differ (more steps, cadence, scoring workers, memory knobs); any other
  difference refuses, naming the keys.
- A run takes a new directory, an empty one, or one that holds a run (its ``run.lock``, which stays after
  the run, or its ``run.json``); any other directory is refused before anything in it is written or removed.
- A run that stops raises one exception whose message is the line a user needs: interrupted
  (``TrainingInterrupted``, with the resume command) or out of disk (``DiskFullError``: what was
  kept, how to resume).  A run that fails before its first step removes the directory it created, and
  no other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reasonrl.config import Config, ConfigError, load_config, to_dict
from reasonrl.config.render import render_yaml
from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)

RECORD_FILE = "run.json"
CONFIG_FILE = "config.yaml"
LOCK_FILE = "run.lock"

RESUMABLE_KEYS = (
    "train.rollout_steps",
    "run.eval_every",
    "run.save_every",
    "run.keep_checkpoints",
    "reward.workers",
    "reward.timeout_seconds",
    "reward.max_error_fraction",
    "train.microbatch_tokens",
    "train.pack_sequences",
    "train.share_prompts",
    "model.gradient_checkpointing",
    "model.checkpoint_policy",
    "train.memory_check",
    "train.offload_optimizer",
    "rollout.engine",
    "run.threads",
    "run.log_samples",
    "train.constant_reward_stop_steps",
)
"""Settings a resumed run may change: how long it runs, how often it evaluates and saves, what it logs, and knobs
that trade memory or speed without changing what is learnt (and when failing reward calls, or rewards that never
vary, stop the run)."""

LOCATION_KEYS = ("run.output_dir", "run.name", "run.resume")
"""Where the directory is and whether to resume: the directory itself, not its run's settings."""

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class RunDirError(ConfigError):
    """A run directory that cannot take this run: in use, other settings, or not a run directory."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says where it stopped and how to resume."""


class DiskFullError(ReasonRLError, OSError):
    """The disk filled during a run; the message says what was kept and how to resume."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass
class RunRecord:
    """What ``run.json`` holds: how the run was made."""

    preset: str
    overrides: list[str] = field(default_factory=list)
    custom: list[str] = field(default_factory=list)
    """Objects given to ``fit()`` (a verifier, an engine) that the command line cannot rebuild."""

    @classmethod
    def read(cls, run_dir: Path) -> RunRecord | None:
        """The record of a run directory, or None when it has none."""
        path = run_dir / RECORD_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(str(data.get("preset", "custom")), list(data.get("overrides", [])), list(data.get("custom", [])))

    def write(self, run_dir: Path) -> None:
        """Write ``run.json`` (atomically)."""
        data = {"preset": self.preset, "overrides": self.overrides, "custom": self.custom}
        _write_atomic(run_dir / RECORD_FILE, json.dumps(data) + "\n")

    def resume_command(self, run_dir: Path) -> str:
        """How a user continues this run."""
        if self.custom:
            scripted = all(f" {SCRIPT_MODULE}:" in entry for entry in self.custom)  # the Python API's run
            call = f"reasonrl.train(..., run_dir={str(run_dir)!r})" if scripted else f"fit(cfg, {str(run_dir)!r}, ...)"
            return f"{call} again with the same {' and '.join(self.custom)}"
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        if ranks > 1:
            return f"torchrun --standalone --nproc-per-node {ranks} -m reasonrl train --resume {run_dir}"
        return f"reasonrl train --resume {run_dir}"


def custom_objects(**objects: object) -> list[str]:
    """How ``run.json`` names the objects given to ``fit()`` (None = not given)."""
    return [f"{name} {type(o).__module__}.{type(o).__qualname__}" for name, o in objects.items() if o is not None]


SCRIPT_MODULE = "__main__"


def script_functions(cfg: Config) -> list[str]:
    """How ``run.json`` names the reward functions and the environment of ``cfg`` that live in the script which
    runs it (``__main__:name``, as the Python API names an object defined there, or ``object:...``, a factory
    object it holds): no command line can rebuild them."""
    named = [*(("reward function", spec) for spec in cfg.reward.functions), ("environment", cfg.rollout.environment)]
    held = (f"{SCRIPT_MODULE}:", "object:")  # a script's, or an object the API holds (rollout.multiturn.environments)
    return [f"{kind} {spec}" for kind, spec in named if spec and spec.startswith(held)]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _text(value: Any) -> str:
    """A setting's value as a command-line override writes it (YAML flow style)."""
    value = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).removesuffix("\n...\n").strip()


def flat_settings(cfg: Config) -> dict[str, Any]:
    """Every setting of a config by dotted key."""

    def walk(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return dict(walk(to_dict(cfg), ""))


def setting_changes(recorded: Config, wanted: Config) -> dict[str, tuple[Any, Any]]:
    """Keys whose value differs, as key -> (recorded, wanted); the directory's location keys excluded."""
    old, new = flat_settings(recorded), flat_settings(wanted)
    return {k: (old[k], new[k]) for k in old if old[k] != new[k] and k not in LOCATION_KEYS}


def recorded_config(run_dir: Path) -> Config | None:
    """The settings a run directory was made with (its ``config.yaml``), or None."""
    path = run_dir / CONFIG_FILE
    return load_config(path) if path.is_file() else None


def override(key: str, value: Any) -> str:
    """A setting as the command line writes it: ``key=value``."""
    return f"{key}={_text(value)}"


def merged_overrides(overrides: Sequence[str], changes: dict[str, tuple[Any, Any]]) -> list[str]:
    """``overrides`` with every changed key set to its new value (replacing an earlier entry of that key)."""
    updated = {key: override(key, new) for key, (_, new) in changes.items()}
    kept = [item for item in overrides if item.partition("=")[0].strip() not in updated]
    return [*kept, *updated.values()]


def _describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key}={_text(new)} (recorded: {_text(old)})" for key, (old, new) in changes.items())


def check_resumable(run_dir: Path, recorded: Config, wanted: Config, checkpoint_step: int) -> dict[str, tuple]:
    """The accepted changes of continuing the run in ``run_dir`` with ``wanted``; refuses any other."""
    changes = setting_changes(recorded, wanted)
    refused = {k: v for k, v in changes.items() if k not in RESUMABLE_KEYS}
    if refused:
        raise RunDirError(
            f"{run_dir} holds a run with other settings: {_describe_changes(refused)}. A run directory keeps "
            f"its settings; continuing it may change only {', '.join(RESUMABLE_KEYS)}. To change anything else, "
            f"start a new run (another run.name) or remove {run_dir}"
        )
    if wanted.run.resume == "never":
        raise RunDirError(
            f"run.resume=never, but {run_dir} already holds a run; choose another run.name or remove {run_dir}"
        )
    if wanted.train.rollout_steps < checkpoint_step:
        raise RunDirError(
            f"train.rollout_steps={wanted.train.rollout_steps} is below the step of the run's latest checkpoint "
            f"({checkpoint_step}); give at least {checkpoint_step}"
        )
    return changes


# --- the lock -----------------------------------------------------------------------------------


class RunLock:
    """An exclusive ``flock`` on ``run.lock`` holding the live run's pid."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or refuse naming the pid of the run that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a planted link: ELOOP
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"{self.path.parent} is in use by a live run (pid {holder}); wait for it to finish, stop it, "
                "or choose another run.name"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file means no live run)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# --- where a stopped run is ---------------------------------------------------------------------


def last_metrics_step(run_dir: Path) -> int:
    """The step of the last row of ``metrics.jsonl`` (0 when it has none)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            return int(json.loads(line).get("step", 0))
    return 0


def checkpoint_step(run_dir: Path) -> int:
    """The step of the run's latest complete checkpoint (0 when it has none)."""
    from reasonrl.training.record.checkpoint import STATE_FILE, latest_checkpoint

    latest = latest_checkpoint(run_dir)
    return int(json.loads((latest / STATE_FILE).read_text())["step"]) if latest else 0


def finished_steps(run_dir: Path) -> int:
    """The steps the run had when it last finished (``summary.json``, written at its end; 0 if it never did)."""
    path = run_dir / "summary.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return int(json.loads(path.read_text()).get("steps", 0))
    return 0


def has_progress(run_dir: Path) -> bool:
    """Whether a run kept anything worth resuming from: a finished step, a checkpoint or a pretrained critic."""
    return last_metrics_step(run_dir) > 0 or checkpoint_step(run_dir) > 0 or (run_dir / "critic_pretrained").exists()


def _kept(run_dir: Path) -> str:
    saved = checkpoint_step(run_dir)
    done = last_metrics_step(run_dir)
    if saved:
        return f"the checkpoint of step {saved} and metrics to step {done}"
    return f"metrics to step {done} but no checkpoint yet (a resume restarts from step 0)"


def _is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def _stopped(exc: BaseException, run_dir: Path, record: RunRecord, removed: bool) -> BaseException | None:
    """The user-facing exception for a run stopped by ``exc``; None to let ``exc`` through as it is."""
    if isinstance(exc, KeyboardInterrupt):
        if removed:
            return TrainingInterrupted(f"interrupted before the first step; removed {run_dir}")
        saved, done = checkpoint_step(run_dir), last_metrics_step(run_dir)
        if saved and saved == done:
            return TrainingInterrupted(
                f"interrupted at step {done}; saved checkpoint step-{saved:06d}; resume with: "
                f"{record.resume_command(run_dir)}"
            )
        return TrainingInterrupted(
            f"interrupted at step {done}; resume with: {record.resume_command(run_dir)} "
            f"(continues from {f'the checkpoint of step {saved}' if saved else 'step 0: no checkpoint yet'})"
        )
    if _is_disk_full(exc):
        assert isinstance(exc, OSError)
        where = f" writing {exc.filename}" if exc.filename else ""
        if removed:
            return DiskFullError(exc.errno, f"disk full{where} before the first step; removed {run_dir}")
        return DiskFullError(
            exc.errno,
            f"disk full{where}; kept {_kept(run_dir)}. Free some space (a checkpoint's size is logged when it is "
            f"written), then resume with: {record.resume_command(run_dir)}",
        )
    return None


# --- claiming a directory -----------------------------------------------------------------------


def _unwritable(run_dir: Path, exc: OSError) -> RunDirError:
    """The error for a run directory that cannot be created or written (read-only, a file in the way)."""
    in_the_way = next((p for p in (*reversed(run_dir.parents), run_dir) if p.is_file()), None)
    why = f"{in_the_way} is a file, not a directory" if in_the_way else (exc.strerror or str(exc)).lower()
    return RunDirError(
        f"cannot write the run directory {run_dir}: {why}; set run.output_dir to a directory you can write"
    )


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run's: it has the ``run.lock`` every run leaves, or a ``run.json``."""
    return (run_dir / LOCK_FILE).exists() or (run_dir / RECORD_FILE).exists()


def make_run_dir(run_dir: Path) -> bool:
    """Make ``run_dir`` for a run, or take an existing one that is empty or holds a run; returns whether it made it.

    Any other directory is refused (RunDirError) before anything in it is written or removed: a run writes
    its own files there (``final/``, ``summary.md``, checkpoints) and, failing early, removes the directory it
    made.  A directory taken is marked as a run's by its ``run.lock`` (the Python API writes the run's inputs
    there before ``fit`` claims it).  One that cannot be made or written is a RunDirError saying why.
    """
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError as exc:
        if not run_dir.is_dir():
            raise _unwritable(run_dir, exc) from None
        if holds_a_run(run_dir):
            return False
        if any(run_dir.iterdir()):
            raise RunDirError(
                f"{run_dir} is not empty and holds no run (no {LOCK_FILE} or {RECORD_FILE}); a run takes only a new "
                "or empty directory, or one of its own: choose another run.name (or run_dir)"
            ) from None
        created = False
    except OSError as exc:
        raise _unwritable(run_dir, exc) from None
    else:
        created = True
    try:
        (run_dir / LOCK_FILE).touch()
    except OSError as exc:
        if created:
            run_dir.rmdir()
        raise _unwritable(run_dir, exc) from None
    return created


@contextlib.contextmanager
def claim(
    run_dir: Path, cfg: Config, preset: str, overrides: Sequence[str], custom: Sequence[str] = ()
) -> Iterator[RunRecord]:
    """Hold ``run_dir`` for one run of ``cfg``; yields the run's record (kept from an earlier start).

    The directory is taken as ``make_run_dir`` takes it; then what a run killed mid-checkpoint left is removed.
    On the way out, a run that failed before its first step removes the directory if it created it,
    and a Ctrl-C or a full disk becomes ``TrainingInterrupted`` / ``DiskFullError`` with the line to show.
    """
    from reasonrl.training.record.checkpoint import remove_unfinished

    created = make_run_dir(run_dir)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except BaseException as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _unwritable(run_dir, exc) from None
        raise
    try:
        record = _claim_identity(run_dir, cfg, preset, overrides, custom)
        remove_unfinished(run_dir)
    except BaseException:
        lock.release()
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        yield record
    except BaseException as exc:
        removed = created and not has_progress(run_dir)
        if removed:
            shutil.rmtree(run_dir, ignore_errors=True)
        stopped = _stopped(exc, run_dir, record, removed)
        if stopped is None:
            raise
        raise stopped from (None if isinstance(exc, KeyboardInterrupt) else exc)
    finally:
        lock.release()


def _claim_identity(
    run_dir: Path, cfg: Config, preset: str, overrides: Sequence[str], custom: Sequence[str]
) -> RunRecord:
    """Check ``cfg`` against what the directory holds; write ``run.json`` and ``config.yaml``."""
    recorded = recorded_config(run_dir)
    record = RunRecord.read(run_dir)
    if recorded is None:
        record = RunRecord(preset, list(overrides), list(custom))
    else:
        changes = check_resumable(run_dir, recorded, cfg, checkpoint_step(run_dir))
        record = record or RunRecord(preset, list(overrides), list(custom))
        record.overrides = merged_overrides(record.overrides, changes)
        record.custom = list(custom)
        if changes:
            log.info("continuing %s with %s", run_dir, _describe_changes(changes))
    record.write(run_dir)
    _write_atomic(run_dir / CONFIG_FILE, render_yaml(cfg))
    return record
