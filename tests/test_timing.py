"""Stage timing: the stage's name is its metric key; repeated stages add up."""

import pytest

from reasonrl import timing
from reasonrl.timing import Progress, ProgressState, progress_mode, timed


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


def test_the_progress_line_shows_done_of_total_rate_and_time_left():
    state = ProgressState("eval", "greedy", total=200, done=50, unit="problems", status="acc 0.42", tokens=6000)
    state.started = 1000.0
    # 50 problems and 6000 tokens in 100 s: 60 tok/s, and 150 problems at 2 s each left
    assert state.line(1100.0) == "eval greedy: 50/200 problems  acc 0.42  60 tok/s  elapsed 0:01:40  left 0:05:00"
    state.done = state.done_before = 150  # a resumed stage: what was done before it is no part of the pace
    assert state.line(1100.0) == "eval greedy: 150/200 problems  acc 0.42  60 tok/s  elapsed 0:01:40  left -:--:--"
    state.done = 175
    assert state.left(1100.0) == "left 0:01:40"
    assert (
        ProgressState("rm train", "training", total=7).line(1.0)
        == "rm train training: 0/7  elapsed 0:00:01  left -:--:--"
    )


def test_progress_is_quiet_off_a_terminal_unless_asked(capsys):
    assert [progress_mode(show) for show in (None, True, False)] == ["off", "lines", "off"]
    with Progress("data sample", show=True, line_seconds=3600) as progress:
        progress.stage("sampling", 3, "prompts")
        for _ in range(3):
            progress.advance(1)
    with Progress("data sample", show=None) as progress:
        progress.stage("sampling", 3, "prompts")
        progress.advance(3)
        progress.log("a note")
    lines = capsys.readouterr().err.splitlines()
    # asked: the first line at once, then one a line_seconds at most, and the stage's last
    assert [line.split("  ")[0] for line in lines] == [
        "data sample sampling: 1/3 prompts",
        "data sample sampling: 3/3 prompts",
    ]
