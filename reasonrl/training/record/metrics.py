"""Where metrics go: a JSONL file (the source of truth), the trackers (TensorBoard, ...), and a progress bar."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import resource
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from reasonrl.timing import Progress
from reasonrl.training.record.trackers import TensorBoardTracker, Tracker


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def device_memory_metrics(device: torch.device) -> dict[str, float]:
    """``perf/peak_gpu_memory_gb``: the most GPU memory torch has held on ``device`` so far (none on a CPU)."""
    if device.type != "cuda":
        return {}
    return {"perf/peak_gpu_memory_gb": torch.cuda.max_memory_allocated(device) / 1024**3}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (but a last line cut short by a kill or a full disk)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines[:-1]]
    with contextlib.suppress(json.JSONDecodeError):
        records.extend(json.loads(line) for line in lines[-1:])
    return records


class MetricsWriter:
    """Appends one JSON object per step to ``<name>.jsonl`` and mirrors its scalars to trackers.

    ``trackers`` (``reasonrl.training.record.trackers``; shared by the run's streams, closed by their owner)
    default to TensorBoard alone, owned by this writer: ``metrics`` (the RL steps) logs to
    ``tensorboard/``; any other name (e.g. ``value_pretrain``) to ``tensorboard/<name>``, so its
    step numbers do not collide with the RL steps'.
    """

    def __init__(
        self, run_dir: Path, resume_step: int = 0, name: str = "metrics", trackers: Sequence[Tracker] | None = None
    ) -> None:
        self.path = run_dir / f"{name}.jsonl"
        self.name = name
        # a restart replays every step past the checkpoint it resumes (all of them, step 0's evaluation
        # included, when there is none): drop their records first, so no step appears twice
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step] if resume_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self._owned = trackers is None
        self.trackers = [TensorBoardTracker(run_dir, resume_step)] if trackers is None else list(trackers)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics."""
        record = {
            "step": step,
            **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()},
        }
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for tracker in self.trackers:
            tracker.log(self.name, step, scalars)

    def close(self) -> None:
        """Flush and close the trackers this writer owns."""
        if self._owned:
            for tracker in self.trackers:
                tracker.close()


def _finite(value: float | None) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


class ProgressDisplay:
    """Training's progress (``reasonrl.timing.Progress``): steps done, elapsed, time left and the running
    step's phase; the last step's reward, accuracy, response length and step time.  Each step also leaves
    one plain line (``RL step 3/10  reward +0.41  acc 0.38  len 112  eval 0.52  12.4s/step  left 0:01:27``):
    above the bar on a terminal, and by default also where stderr is a pipe or a log file, which would
    otherwise show nothing for the hours a run takes.  ``enabled``: False (``--quiet``) shows nothing;
    True or None (the default) show it."""

    STATUS = (  # (metric, label, format); a missing or NaN value is left out
        ("reward/mean", "reward", "{:+.2f}"),
        ("reward/accuracy", "acc", "{:.2f}"),
        ("rollout/response_length", "len", "{:.0f}"),
        ("critic/explained_variance", "EV", "{:+.2f}"),
        ("eval/accuracy", "eval", "{:.2f}"),
    )

    def __init__(
        self, total_steps: int, start_step: int, enabled: bool | None = True, label: str = "RL", work: str = "running"
    ) -> None:
        self.progress = Progress(label, enabled is not False)  # a log file keeps the step lines too
        self.progress.stage("", total_steps, "steps", done=start_step)
        self.label, self.total, self.step, self.work = label, total_steps, start_step, work
        self.phase(work)

    def __enter__(self) -> ProgressDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def phase(self, name: str, step: int | None = None) -> None:
        """Show what ``step`` (default: the running one) is doing, e.g. rollout, update, eval, checkpoint."""
        step = self.step + 1 if step is None else step
        self.progress.phase(f"step {step}: {name}" if step <= self.total else name)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Show the latest step, and keep its line."""
        self.step = step
        numbers = [f"{name} {fmt.format(metrics[key])}" for key, name, fmt in self.STATUS if _finite(metrics.get(key))]
        if _finite(metrics.get("perf/step_seconds")):
            numbers.append(f"{metrics['perf/step_seconds']:.1f}s/step")
        left = dataclasses.replace(self.progress.state, done=step).left(perf_counter())
        line = "  ".join([f"{self.label} step {step}/{self.total}", *numbers, left])
        self.progress.update(step, status="  ".join([f"step {step}", *numbers]), line=line)
        self.phase("done" if step >= self.total else self.work)

    def log(self, message: str) -> None:
        """Print a line above the bar."""
        self.progress.log(message)

    def accuracy_before(self, accuracy: float) -> None:
        """Say the held-out accuracy the run starts from (step 0's evaluation)."""
        self.log(f"held-out accuracy before training: {accuracy:.1%}")
