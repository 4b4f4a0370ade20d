"""A run directory owns its identity: one live run, recorded settings, and clean stops (Ctrl-C, full disk)."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.training.loop import fit
from reasonrl.training.record.checkpoint import LinkedCheckpointsError, latest_checkpoint, save_checkpoint
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.rundir import DiskFullError, RunDirError, RunLock, claim
from tests.helpers import DigitFraction

TINY = [
    "model.name_or_path=tiny-random",
    "rollout.rollout_prompts=4",
    "rollout.samples_per_prompt=4",
    "rollout.max_response_tokens=8",
    "train.minibatch_sequences=8",
    "data.eval_prompts=4",
    "reward.workers=1",
    "algo.kl_placement=none",
]


def cli_train(tmp_path, *extra):
    return main(["train", "grpo", *TINY, f"run.output_dir={tmp_path}", "run.name=r", *extra, "--quiet"])


def steps(run_dir):
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]


def test_resume_keeps_the_recorded_settings_accepts_more_steps_and_refuses_the_rest(tmp_path, capsys):
    run_dir = tmp_path / "r"
    assert cli_train(tmp_path, "train.rollout_steps=1") == 0
    capsys.readouterr()
    # overrides count wherever they stand: right after the directory (argparse's preset slot) or after an option
    assert main(["train", "--resume", str(run_dir), "train.rollout_steps=2", "--quiet", "run.eval_every=2"]) == 0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["preset"] == "grpo" and "model.name_or_path=tiny-random" in record["overrides"]
    assert record["overrides"][-2:] == ["train.rollout_steps=2", "run.eval_every=2"]
    assert "train.rollout_steps=1" not in record["overrides"]
    reproduce = (run_dir / "summary.md").read_text().splitlines()[-1]
    assert reproduce.startswith("Reproduce: `reasonrl train grpo model.name_or_path=tiny-random")
    assert "train.rollout_steps=2" in reproduce
    assert steps(run_dir) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "INFO     continuing" in err and "INFO     resuming from" in err and "WARNING" not in err  # notices
    assert re.search(r"saved the checkpoint of step 2: .*\(0\.\d MB: model.safetensors 0\.\d MB, trainer.pt", err, re.S)

    # other settings are refused, naming the keys, whichever way they are given
    assert main(["train", "--resume", str(run_dir), "algo.eps_high=0.3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings: algo.eps_high=0.3 (recorded: 0.2)" in err
    assert "may change only train.rollout_steps" in err
    assert cli_train(tmp_path, "train.rollout_steps=2", "algo.eps_high=0.3", "train.lr=1e-4") == 2
    assert "algo.eps_high=0.3 (recorded: 0.2), train.lr=0.0001 (recorded: 1.0e-05)" in capsys.readouterr().err
    assert main(["train", "dapo", "--resume", str(run_dir)]) == 2
    assert f"{run_dir} is a grpo run, not dapo" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_dir), "train.rollout_steps=1"]) == 2
    assert "below the step of the run's latest checkpoint (2)" in capsys.readouterr().err
    assert json.loads((run_dir / "run.json").read_text()) == record  # refusals change nothing


def test_a_second_run_into_a_live_directory_refuses_naming_its_pid_and_a_killed_run_leaves_no_lock(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from reasonrl.training.record.rundir import RunLock\n"
         f"RunLock(Path({str(run_dir)!r})).acquire(); print('locked', flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = load_config("grpo", TINY)
        with pytest.raises(RunDirError, match=rf"{run_dir} is in use by a live run \(pid {holder.pid}\)"):
            fit(cfg, run_dir, verifier=DigitFraction(), show_progress=False)
    finally:
        holder.kill()  # kill -9: no chance to clean up
        holder.wait()
    with claim(run_dir, cfg, "grpo", []), pytest.raises(RunDirError, match=rf"pid {os.getpid()}"):
        RunLock(run_dir).acquire()  # the kernel dropped the dead run's lock: this process holds it now


def test_a_new_run_into_a_directory_holding_a_run_refuses_run_resume_never(tmp_path):
    cfg = load_config("grpo", TINY)
    with claim(tmp_path / "r", cfg, "grpo", []):
        pass
    never = load_config("grpo", [*TINY, "run.resume=never"])
    refused = pytest.raises(RunDirError, match=r"run\.resume=never, but .* already holds a run")
    with refused, claim(tmp_path / "r", never, "grpo", []):
        pass


def test_a_run_that_fails_before_its_first_step_removes_the_directory_it_created(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?"}\n')
    cfg = load_config("grpo", [*TINY, f"data.dataset={bad}"])
    with pytest.raises(ValueError, match="no field 'answer'"):
        fit(cfg, tmp_path / "new", verifier=DigitFraction(), show_progress=False)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a directory the run did not create stays
    with pytest.raises(ValueError, match="no field 'answer'"):
        fit(cfg, tmp_path / "mine", verifier=DigitFraction(), show_progress=False)
    assert (tmp_path / "mine").is_dir()


def test_an_unwritable_output_dir_is_one_error_line_and_exit_status_2(tmp_path, capsys, monkeypatch):
    (tmp_path / "a-file").write_text("")
    assert cli_train(tmp_path / "a-file") == 2
    err = capsys.readouterr().err
    assert f"reasonrl: error: cannot write the run directory {tmp_path}/a-file/r: {tmp_path}/a-file is a file" in err
    assert "set run.output_dir to a directory you can write" in err and "Traceback" not in err

    read_only, real_mkdir = tmp_path / "read-only", Path.mkdir

    def mkdir(path, *args, **kwargs):  # a read-only filesystem (chmod does not stop root)
        if path.is_relative_to(read_only):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert cli_train(read_only) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reasonrl: error:")]
    assert lines == [f"reasonrl: error: cannot write the run directory {read_only}/r: read-only file system; "
                     "set run.output_dir to a directory you can write"]  # fmt: skip


def interrupt_on_call(monkeypatch, name, call):
    """Make ``reasonrl.training.loop.<name>`` raise KeyboardInterrupt on its ``call``-th call."""
    import reasonrl.training.loop as loop

    real, calls = getattr(loop, name), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, name, wrapper)


def test_ctrl_c_prints_one_line_with_the_resume_command_and_exits_130(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "r"
    interrupt_on_call(monkeypatch, "assign_advantages", 3)  # during step 3's rollout: step 2 is the last finished
    assert cli_train(tmp_path, "train.rollout_steps=3", "run.save_every=10") == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"reasonrl: interrupted at step 2; saved checkpoint step-000002; resume with: reasonrl train --resume {run_dir}"
    )
    assert "Traceback" not in err
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step-000002"  # saved on the interrupt
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert steps(run_dir) == [0, 1, 2, 3]


def test_the_run_from_python_is_resumed_from_python_not_the_command_line(tmp_path, capsys):
    run_dir = tmp_path / "py"
    fit(load_config("grpo", [*TINY, "train.rollout_steps=1"]), run_dir, verifier=DigitFraction(), show_progress=False)
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "was trained from Python with a verifier tests.helpers.DigitFraction" in err
    assert f"fit(cfg, {str(run_dir)!r}, ...) again" in err
    (run_dir / "run.json").unlink()  # made before runs recorded how they were made
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert "has no run.json (it was made by fit() from Python)" in capsys.readouterr().err


def full_disk_on_save(monkeypatch, call):
    """torch.save in checkpoints writes part of its file, then fails with ENOSPC on its ``call``-th call."""
    import reasonrl.training.record.checkpoint as checkpoint

    real, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            with open(path, "wb") as handle:
                handle.write(b"x" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)


def test_a_full_disk_stops_with_one_line_keeps_the_run_and_the_resume_has_no_duplicate_rows(
    tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "r"
    full_disk_on_save(monkeypatch, 1)  # the first checkpoint
    assert cli_train(tmp_path, "train.rollout_steps=3", "run.save_every=2") == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"reasonrl: error: disk full writing {run_dir}/checkpoints/step-000002.tmp; kept metrics to step 2 but no "
        "checkpoint yet (a resume restarts from step 0). Free some space (a checkpoint's size is logged when it is "
        f"written), then resume with: reasonrl train --resume {run_dir}"
    )
    assert "Traceback" not in err
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    monkeypatch.undo()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert steps(run_dir) == [0, 1, 2, 3]  # one step-0 row: the restart from step 0 replaced the old rows


def test_a_failed_checkpoint_write_removes_its_temp_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"x": 1}, keep=1)
    full_disk_on_save(monkeypatch, 1)
    with pytest.raises(OSError) as failure:
        save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"x": 2}, keep=1)
    assert failure.value.errno == errno.ENOSPC and failure.value.filename.endswith("step-000002.tmp")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000001"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-000001"
    assert json.loads((tmp_path / "checkpoints" / "step-000001" / "state.json").read_text()) == {"step": 1, "x": 1}
    assert issubclass(DiskFullError, OSError)


def test_ctrl_c_at_the_terminal_stops_the_trainer_and_its_scoring_workers_without_tracebacks(tmp_path):
    run_dir = tmp_path / "r"
    command = [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *TINY, "reward.workers=2"]
    command += [f"run.output_dir={tmp_path}", "run.name=r", "train.rollout_steps=100", "--quiet"]
    command += ["train.constant_reward_stop_steps=0"]  # its rewards never vary: it must run until interrupted
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    deadline = time.monotonic() + 120
    while not (run_dir.exists() and max(steps(run_dir), default=0) >= 1) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1].startswith("reasonrl: interrupted at step ")


def test_a_finished_run_stores_its_final_weights_once_and_a_resume_says_it_is_finished(tmp_path, capsys):
    run_dir, final = tmp_path / "r", tmp_path / "r" / "final"
    assert cli_train(tmp_path, "train.rollout_steps=2") == 0
    last = run_dir / "checkpoints" / "step-000002"
    assert (final / "model.safetensors").samefile(last / "model.safetensors")  # the weights once on disk
    assert {p.name for p in final.iterdir()} == {p.name for p in last.iterdir()} - {"trainer.pt", "state.json"}
    step_2_weights = (last / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"reasonrl: {run_dir} is finished: all 2 steps (train.rollout_steps) are done and its model is in {final}. "
        f"To train it longer: reasonrl train --resume {run_dir} train.rollout_steps=N (N > 2)"
    ]
    assert steps(run_dir) == [0, 1, 2]
    # longer: from the last checkpoint (its optimiser state kept); final/ moves on, step 2's weights stay
    assert main(["train", "--resume", str(run_dir), "train.rollout_steps=3", "--quiet"]) == 0
    assert steps(run_dir) == [0, 1, 2, 3]
    assert (final / "model.safetensors").samefile(run_dir / "checkpoints" / "step-000003" / "model.safetensors")
    assert (last / "model.safetensors").read_bytes() == step_2_weights


SLOW_SAVES = """
import sys, time
import reasonrl.training.backend as backend
real = backend.save_checkpoint
def slow(*args, **kwargs):
    time.sleep(60)
    return real(*args, **kwargs)
backend.save_checkpoint = slow
from reasonrl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def stderr_of_exited(process, timeout: float) -> str:
    """The stderr of ``process`` once it exits; one still running after ``timeout`` seconds fails the test
    with the stack of each of its threads (faulthandler, on SIGABRT), so a hang says where it hangs."""
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        err = process.communicate()[1]
        pytest.fail(f"the training process did not exit within {timeout:g} s; its threads:\n{err[-8000:]}")


def start_training(tmp_path, *python):
    """``reasonrl train`` of 100 steps (a checkpoint every 10) as a terminal's foreground job."""
    command = [*python, "train", "grpo", *TINY, f"run.output_dir={tmp_path}", "run.name=r", "train.rollout_steps=100"]
    command += ["train.constant_reward_stop_steps=0"]  # its rewards never vary: it must run until interrupted
    return subprocess.Popen(
        [*command, "--quiet"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONFAULTHANDLER": "1"},
    )


def ctrl_c_after_step_1(process, run_dir):
    deadline = time.monotonic() + 120
    while not (run_dir.exists() and max(steps(run_dir), default=0) >= 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)


def test_the_first_ctrl_c_saves_the_last_finished_step_and_the_run_resumes_from_it(tmp_path):
    run_dir = tmp_path / "r"
    process = start_training(tmp_path, sys.executable, "-m", "reasonrl")
    ctrl_c_after_step_1(process, run_dir)
    err = stderr_of_exited(process, timeout=120)
    assert process.returncode == 130 and "Traceback" not in err
    done = steps(run_dir)[-1]
    assert 1 <= done < 10  # before the first periodic checkpoint
    assert "Ctrl-C: saving the checkpoint of step" in err
    assert err.splitlines()[-1] == (
        f"reasonrl: interrupted at step {done}; saved checkpoint step-{done:06d}; resume with: "
        f"reasonrl train --resume {run_dir}"
    )
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / f"step-{done:06d}"
    kept = read_metrics(run_dir / "metrics.jsonl")
    assert main(["train", "--resume", str(run_dir), f"train.rollout_steps={done + 1}", "--quiet"]) == 0
    assert read_metrics(run_dir / "metrics.jsonl")[: done + 1] == kept  # continued from there, nothing replayed
    assert steps(run_dir) == list(range(done + 2))


def test_a_second_ctrl_c_stops_at_once_saving_nothing(tmp_path):
    run_dir = tmp_path / "r"
    process = start_training(tmp_path, sys.executable, "-c", SLOW_SAVES)  # each save waits 60 s first
    ctrl_c_after_step_1(process, run_dir)
    notice = ""
    while "Ctrl-C: saving the checkpoint" not in notice and process.poll() is None:
        notice = process.stderr.readline()
    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    err = stderr_of_exited(process, timeout=120)
    assert time.monotonic() - started < 30 and process.returncode == 130  # not after the save's 60 s
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1].endswith("(continues from step 0: no checkpoint yet)")
    assert latest_checkpoint(run_dir) is None


def test_a_metrics_line_cut_short_by_a_full_disk_is_dropped_on_resume(tmp_path):
    from reasonrl.training.record.metrics import MetricsWriter

    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a"')
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "a": 1}, {"step": 1, "a": 2}]
    MetricsWriter(tmp_path, resume_step=1).close()
    assert steps(tmp_path) == [0, 1]


def files_under(root):
    """Every path under ``root`` (a link as its target's name) with a file's text: what a test checks is kept."""
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_text() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def test_a_run_refuses_a_directory_of_other_files_before_a_model_loads_and_removes_nothing(
    tmp_path, capsys, monkeypatch
):
    import reasonrl.training.loop as loop

    mine = tmp_path / "r"  # run.output_dir/run.name: a directory someone made, holding no run
    theirs = {"final/model.safetensors": "my model", "summary.md": "my notes", "checkpoints/a.tmp": "x"}
    for name, text in theirs.items():
        (mine / name).parent.mkdir(parents=True, exist_ok=True)
        (mine / name).write_text(text)
    kept = files_under(mine)
    monkeypatch.setattr(loop, "setup", lambda *args, **kwargs: pytest.fail("a model loaded"))
    assert cli_train(tmp_path, "train.rollout_steps=1") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"reasonrl: error: {mine} is not empty and holds no run (no run.lock or run.json); a run takes only a new "
        "or empty directory, or one of its own: choose another run.name (or run_dir)"
    )
    with pytest.raises(RunDirError, match="is not empty and holds no run"):
        fit(load_config("grpo", TINY), mine, verifier=DigitFraction(), show_progress=False)
    assert files_under(mine) == kept  # nothing written, nothing removed


def test_run_name_is_one_directory_inside_run_output_dir(tmp_path, capsys):
    output_dir = tmp_path / "runs"
    output_dir.mkdir()
    for name in ["..", "../escaped", "a/b", str(tmp_path / "absolute")]:
        assert main(["train", "grpo", *TINY, f"run.output_dir={output_dir}", f"run.name={name}", "--quiet"]) == 2
        assert (
            f"run.name={name!r} must be one directory name inside run.output_dir (no '/', not '.' or '..')"
            in capsys.readouterr().err
        )
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and not any(output_dir.iterdir())


def checkpointed_run(run_dir, *steps):
    """A run directory (its record, as a start writes it) with a checkpoint of a small model at each step."""
    with claim(run_dir, load_config("grpo", TINY), "grpo", []):
        pass
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for step in steps:
        save_checkpoint(run_dir, step, model, optimizer, scheduler, {}, keep=1)
    return lambda step: save_checkpoint(run_dir, step, model, optimizer, scheduler, {}, keep=1)


def someone_elses_files(root):
    """Files outside the run: a directory and a file named like a checkpoint's leftovers, and a checkpoint."""
    (root / "step-000007.tmp").mkdir(parents=True)
    (root / "step-000007.tmp" / "weights").write_text("theirs")
    (root / "notes.tmp").write_text("theirs")
    (root / "step-000009").mkdir()
    (root / "step-000009" / "state.json").write_text('{"step": 9}')
    return files_under(root)


def test_a_linked_checkpoints_directory_is_refused_and_nothing_is_removed_through_it(tmp_path, capsys):
    elsewhere, run_dir = tmp_path / "elsewhere", tmp_path / "runs" / "r"
    kept = someone_elses_files(elsewhere)
    checkpointed_run(run_dir, 1)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").symlink_to(elsewhere)
    refused = f"{run_dir}/checkpoints is a symbolic link (to {elsewhere}); a run keeps its checkpoints in a directory"
    with pytest.raises(LinkedCheckpointsError, match=re.escape(refused)):
        latest_checkpoint(run_dir)
    for resume in (["--resume", str(run_dir)], ["grpo", *TINY, f"run.output_dir={run_dir.parent}", "--resume", "auto"]):
        assert main(["train", *resume, "--quiet"]) == 2
        assert f"reasonrl: error: {refused}" in capsys.readouterr().err
    with (
        pytest.raises(LinkedCheckpointsError, match=re.escape(refused)),
        claim(run_dir, load_config("grpo", TINY), "grpo", []),
    ):
        pass
    assert files_under(elsewhere) == kept


def test_links_in_checkpoints_are_no_checkpoints_and_a_start_removes_leftover_links_not_their_targets(tmp_path):
    elsewhere, run_dir = tmp_path / "elsewhere", tmp_path / "r"
    kept = someone_elses_files(elsewhere)
    save = checkpointed_run(run_dir, 1)
    root = run_dir / "checkpoints"
    (root / "step-000002.tmp").symlink_to(elsewhere / "step-000007.tmp")  # leftovers a start removes
    (root / "latest.tmp").symlink_to(elsewhere / "notes.tmp")
    (root / "step-000009").symlink_to(elsewhere / "step-000009")  # a complete checkpoint, but through a link
    (root / "latest").write_text("../../elsewhere/step-000009")  # names a checkpoint outside the run
    assert latest_checkpoint(run_dir) == root / "step-000001"
    (root / "latest").write_text("step-000009")
    assert latest_checkpoint(run_dir) == root / "step-000001"
    with claim(run_dir, load_config("grpo", TINY), "grpo", []):
        assert not (root / "step-000002.tmp").is_symlink() and not (root / "latest.tmp").is_symlink()
        save(3)  # keeps 1: drops step 1, neither the link nor what it points to
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000003", "step-000009"]
    assert latest_checkpoint(run_dir) == root / "step-000003"
    assert files_under(elsewhere) == kept
