"""Stage timing (verl's ``marked_timer``): ``with timed(metrics, "perf/update_seconds"): ...`` adds the
block's wall time to that metric, so a stage's name is its metric key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter


@contextmanager
def timed(metrics: dict, key: str) -> Iterator[None]:
    """Add the wall-clock seconds the block takes to ``metrics[key]`` (from 0 when absent), so a stage
    run several times in a step (a generation pass) adds up."""
    start = perf_counter()
    try:
        yield
    finally:
        metrics[key] = metrics.get(key, 0.0) + perf_counter() - start
