"""Where metrics go: a JSONL file (the source of truth), the trackers (TensorBoard, ...), and a progress bar."""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from reasonrl.train.trackers import TensorBoardTracker, Tracker

CONSOLE = Console(stderr=True)  # shared by the progress bar and log messages, so they do not garble


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Each step frees and reallocates hundreds of MB (KV caches, packed weights, activations); without
    trimming, glibc keeps the freed pages and the resident size creeps up step after step.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsWriter:
    """Appends one JSON object per step to ``<name>.jsonl`` and mirrors its scalars to trackers.

    ``trackers`` (``reasonrl.train.trackers``; shared by the run's streams, closed by their owner)
    default to TensorBoard alone, owned by this writer: ``metrics`` (the RL steps) logs to
    ``tensorboard/``; any other name (e.g. ``value_pretrain``) to ``tensorboard/<name>``, so its
    step numbers do not collide with the RL steps'.
    """

    def __init__(
        self, run_dir: Path, resume_step: int = 0, name: str = "metrics", trackers: Sequence[Tracker] | None = None
    ) -> None:
        self.path = run_dir / f"{name}.jsonl"
        self.name = name
        # after a crash, records past the checkpoint being resumed are replayed: drop them first
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
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


class ProgressDisplay:
    """A progress bar with step, reward, accuracy, response length and step time."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool = True, label: str = "RL") -> None:
        self.console = CONSOLE if enabled else Console(stderr=True, quiet=True)
        self.progress = Progress(
            TextColumn(f"[bold]{label}[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, status="starting")

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Show the latest step."""
        status = (
            f"reward {metrics.get('reward/mean', float('nan')):+.2f}  "
            f"acc {metrics.get('reward/accuracy', float('nan')):.2f}  "
            f"len {metrics.get('rollout/response_length', float('nan')):.0f}  "
            f"{metrics.get('perf/step_seconds', float('nan')):.1f}s/step"
        )
        if "critic/explained_variance" in metrics:
            status += f"  EV {metrics['critic/explained_variance']:+.2f}"
        if "eval/accuracy" in metrics:
            status += f"  eval {metrics['eval/accuracy']:.2f}"
        self.progress.update(self.task, completed=step, status=status)

    def log(self, message: str) -> None:
        """Print a line above the bar."""
        self.progress.console.print(message)
