"""The progress bar fits 80 columns, shows the time remaining and the running phase, and hides NaNs;
each step leaves a line, in a log file as on a terminal."""

import io
import re

from rich.console import Console

from reasonrl import timing
from reasonrl.cli import main
from reasonrl.training.record.metrics import ProgressDisplay
from tests.train.test_loop import TINY

VAPO_STEP = {
    "reward/mean": 0.5,
    "reward/accuracy": 0.43,
    "rollout/response_length": 23.0,
    "critic/explained_variance": float("nan"),
    "eval/accuracy": 0.5,
    "perf/step_seconds": 35.2,
}


def screens(label):
    """What the display shows: during step 1, during step 2, and at step 2's checkpoint (of 1000 steps)."""
    display = ProgressDisplay(1000, 0, label=label)
    display.phase("rollout")
    shown = [render(display)]
    display.update(1, VAPO_STEP)
    display.phase("update")
    shown.append(render(display))
    display.update(2, VAPO_STEP)
    display.phase("checkpoint", 2)
    shown.append(render(display))
    return shown


def render(display):
    console = Console(width=80, color_system=None)
    with console.capture() as capture:
        for renderable in display.progress.bar.get_renderables():
            console.print(renderable)
    return capture.get()


def test_the_bar_fits_80_columns_and_shows_phase_time_left_and_no_nan():
    for label in ("RL", "value pretraining"):
        first, second, third = screens(label)
        for screen in (first, second, third):
            assert all(len(line) <= 80 for line in screen.splitlines()), screen
            assert "…" not in screen and "nan" not in screen, screen
        assert "step 1: rollout" in first and "left -:--:--" in first
        assert "step 2: update" in second and re.search(r"left \d+:\d\d:\d\d", second)
        assert "1/1000" in second and "step 1  reward +0.50  acc 0.43  len 23  eval 0.50  35.2s/step" in second
        assert "EV" not in second  # NaN explained variance is left out
        assert "step 2: checkpoint" in third


def test_a_log_file_gets_one_line_a_step_unless_quiet(tmp_path, capsys):
    run = ["train", "grpo", *TINY, f"run.output_dir={tmp_path}", "run.name=r", "run.eval_every=2"]
    assert main([*run, "train.rollout_steps=2"]) == 0  # stderr is no terminal here, as with nohup or Slurm
    err = capsys.readouterr().err
    assert "held-out accuracy before training: " in err
    steps = [line for line in err.splitlines() if line.startswith("RL step")]
    number = r"[+-]?\d\.\d\d"
    assert len(steps) == 2
    assert re.fullmatch(
        rf"RL step 1/2  reward {number}  acc {number}  len \d+  \d+\.\ds/step  left \d:\d\d:\d\d", steps[0]
    )
    assert re.fullmatch(rf"RL step 2/2  reward .*  eval {number}  \d+\.\ds/step  left 0:00:00", steps[1])
    assert main(["train", "--resume", str(tmp_path / "r"), "train.rollout_steps=3", "--quiet"]) == 0
    assert "RL step" not in capsys.readouterr().err


def test_on_a_terminal_each_step_leaves_its_line_above_the_bar(monkeypatch):
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    monkeypatch.setattr(timing, "stderr_console", lambda: console)
    with ProgressDisplay(3, 0) as display:
        for step in (1, 2, 3):
            display.update(step, VAPO_STEP)
    shown = console.file.getvalue()
    for step in (1, 2, 3):
        assert f"RL step {step}/3  reward +0.50  acc 0.43  len 23  eval 0.50  35.2s/step  left " in shown
