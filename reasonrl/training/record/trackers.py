"""Experiment trackers (``run.loggers``): TensorBoard, Weights & Biases, MLflow.

They mirror what ``MetricsWriter`` appends to ``metrics.jsonl``, which stays the source of truth
(plots, summaries and resume read the file, never a tracker).  Each tracker's package is imported
only when it is listed, and its own settings are honoured: ``WANDB_MODE=offline`` (or
``wandb offline``), ``WANDB_PROJECT``, ``WANDB_DIR``, ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``.  Without ``MLFLOW_TRACKING_URI``, MLflow writes to a local file store,
``mlruns/`` next to the run directories.  A resumed run continues the same W&B / MLflow run (their
ids are kept in ``trackers.json`` in the run directory).

Streams: ``metrics`` (the RL steps) and ``value_pretrain`` (value pretraining, before step 1).
TensorBoard writes other streams under ``tensorboard/<stream>``; W&B and MLflow prefix their keys
with ``<stream>/`` and give them their own step axis.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)
WRITER_CLOSE_SECONDS = 10

MAIN_STREAM = "metrics"
PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow"}
STATE_FILE = "trackers.json"


class TrackerError(ReasonRLError, RuntimeError):
    """A tracker listed in ``run.loggers`` that cannot be used, with what to do about it."""


class Tracker(Protocol):
    """Where a copy of each step's scalar metrics goes."""

    def log(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step of ``stream``."""
        ...

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """Record a few of one RL step's samples as text (``reasonrl.training.record.sample_log``)."""
        ...

    def close(self) -> None:
        """Flush and finish."""
        ...


SAMPLE_COLUMNS = ("prompt", "completion", "reward", "correct", "advantage", "response_tokens", "truncated")
"""The columns of a samples table (a conversation's turns are in its completion)."""


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Samples as a markdown table (TensorBoard's text panel renders it)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    rows = [f"| {' | '.join(SAMPLE_COLUMNS)} |", f"|{'---|' * len(SAMPLE_COLUMNS)}"]
    rows += [f"| {' | '.join(cell(sample.get(c)) for c in SAMPLE_COLUMNS)} |" for sample in samples]
    return "\n".join(rows)


def _installed(module: str) -> bool:
    if module in sys.modules:  # imported already (None: an import that is blocked)
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def check_trackers(names: Sequence[str]) -> None:
    """Raise TrackerError naming the install command when a listed tracker's package is missing."""
    missing = [name for name in names if not _installed(PACKAGES[name])]
    if missing:
        extras = ",".join(n for n in missing if n != "tensorboard")
        hint = f"pip install 'reasonrl[{extras}]'" if extras else "pip install tensorboardX"
        raise TrackerError(
            f"run.loggers lists {', '.join(missing)}, which is not installed: {hint}, or remove it from run.loggers"
        )


def _state(run_dir: Path) -> dict[str, str]:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _remember(run_dir: Path, key: str, value: str) -> None:
    (run_dir / STATE_FILE).write_text(json.dumps({**_state(run_dir), key: value}, indent=2) + "\n")


class TensorBoardTracker:
    """tensorboardX event files: ``tensorboard/`` for the RL steps, ``tensorboard/<stream>`` for others."""

    def __init__(self, run_dir: Path, resume_step: int = 0) -> None:
        self.run_dir, self.resume_step = run_dir, resume_step
        self._writers: dict[str, Any] = {}

    def _writer(self, stream: str):
        if stream not in self._writers:
            from tensorboardX import SummaryWriter

            main = stream == MAIN_STREAM
            board = self.run_dir / "tensorboard" if main else self.run_dir / "tensorboard" / stream
            # a restart replays every step past the checkpoint it resumes (all of them, step 0 included,
            # when there is none, and every step of another stream): drop their events
            purge = self.resume_step + 1 if main and self.resume_step else 0
            self._writers[stream] = SummaryWriter(str(board), purge_step=purge)
        return self._writers[stream]

    def log(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        writer = self._writer(stream)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        writer = self._writer(MAIN_STREAM)
        writer.add_text("samples", samples_markdown(samples), step)
        writer.flush()

    def close(self) -> None:
        """Close each writer (its thread writes what is queued), waiting at most ``WRITER_CLOSE_SECONDS``: a
        writer whose thread never received its stop signal (seen in a clean-clone test run on 2026-11-29, after a
        second Ctrl-C: the process hung in tensorboardX's join) must not keep the run from exiting; such a
        writer's last queued events may be lost, said once, and the closing thread, still running as the interpreter
        exits, prints no traceback (a clean-clone test run on 2026-11-29 saw one)."""
        for stream, writer in self._writers.items():
            closing = threading.Thread(
                target=close_quietly, args=(writer,), name=f"close tensorboard {stream}", daemon=True
            )
            closing.start()
            closing.join(WRITER_CLOSE_SECONDS)
            if closing.is_alive():
                log.warning("the TensorBoard writer of %s did not close within %d s; its last events may be missing",
                            stream, WRITER_CLOSE_SECONDS)  # fmt: skip


def close_quietly(writer) -> None:
    """``writer.close()``; what it raises is one warning line, not a thread's traceback (and nothing at all once the
    interpreter is exiting, when logging itself may fail)."""
    try:
        writer.close()
    except Exception as error:
        with contextlib.suppress(Exception):
            log.warning("closing a TensorBoard writer failed (%s); its last events may be missing", error)


class WandbTracker:
    """A Weights & Biases run; each stream is plotted against its own step axis (``rollout_step``, ...)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        run_id = _state(run_dir).get("wandb_id") or uuid.uuid4().hex[:12]
        _remember(run_dir, "wandb_id", run_id)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "reasonrl",
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
            config=dict(config),
        )
        self._defined: set[str] = set()

    def _define(self, name: str, step_metric: str | None = None) -> None:
        if name not in self._defined:
            if step_metric is None:
                self.run.define_metric(name)
            else:
                self.run.define_metric(name, step_metric=step_metric)
            self._defined.add(name)

    def log(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        main = stream == MAIN_STREAM
        axis = "rollout_step" if main else f"{stream}_step"
        self._define(axis)
        prefix = "" if main else f"{stream}/"
        for key in metrics:
            self._define(f"{prefix}{key.split('/', 1)[0]}/*" if "/" in key else f"{prefix}{key}", axis)
        self.run.log({axis: step, **{f"{prefix}{k}": v for k, v in metrics.items()}})

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=["step", *SAMPLE_COLUMNS], data=[[step, *(s.get(c) for c in SAMPLE_COLUMNS)]
                                                                      for s in samples])  # fmt: skip
        self.run.log({"rollout_step": step, "samples": table})

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run: the config as parameters, each stream's metrics by step (other streams prefixed)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((run_dir.parent / "mlruns").resolve().as_uri())
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or "reasonrl")
        known = _state(run_dir).get("mlflow_run_id")
        run = mlflow.start_run(run_id=known) if known else mlflow.start_run(run_name=run_dir.name)
        if not known:
            _remember(run_dir, "mlflow_run_id", run.info.run_id)
            mlflow.log_params(flatten(config))

    def log(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        prefix = "" if stream == MAIN_STREAM else f"{stream}/"
        self.mlflow.log_metrics({f"{prefix}{k}": float(v) for k, v in metrics.items()}, step=step)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.mlflow.log_dict({"step": step, "samples": list(samples)}, f"samples/step-{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (``{"algo": {"eps_high": 0.28}}`` -> ``{"algo.eps_high": 0.28}``)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def open_trackers(
    names: Sequence[str], run_dir: Path, resume_step: int = 0, config: Mapping[str, Any] | None = None
) -> list[Tracker]:
    """The trackers of ``run.loggers``, started (``config``: the run's settings, for W&B and MLflow)."""
    check_trackers(names)
    trackers: list[Tracker] = []
    for name in dict.fromkeys(names):
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, resume_step))
        elif name == "wandb":
            trackers.append(WandbTracker(run_dir, config or {}))
        else:
            trackers.append(MlflowTracker(run_dir, config or {}))
    return trackers
