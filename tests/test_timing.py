"""Stage timing: the stage's name is its metric key; repeated stages add up."""

import pytest

from reasonrl import timing
from reasonrl.timing import timed


def test_timed_adds_each_blocks_seconds_to_its_key(monkeypatch):
    clock = iter([10.0, 12.5, 20.0, 20.25, 30.0, 31.0])
    monkeypatch.setattr(timing, "perf_counter", lambda: next(clock))
    metrics = {"reward/mean": 0.5}
    with timed(metrics, "perf/generate_seconds"):
        pass
    with timed(metrics, "perf/generate_seconds"):  # a second generation pass
        pass
    with pytest.raises(ValueError), timed(metrics, "perf/score_seconds"):
        raise ValueError("a failing stage is timed too")
    assert metrics == {"reward/mean": 0.5, "perf/generate_seconds": 2.75, "perf/score_seconds": 1.0}
