"""Experiment trackers (run.loggers): W&B and MLflow mirror metrics.jsonl; fakes stand in for both."""

import json
import sys
import types

import pytest

from reasonrl.config import ConfigError
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.trackers import MlflowTracker, WandbTracker
from tests.helpers import DigitFraction
from tests.train.test_loop import tiny_config


class FakeWandbRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.defined, self.logged, self.finished = kwargs, [], [], False

    def define_metric(self, name, step_metric=None):
        self.defined.append((name, step_metric))

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        self.finished = True


def fake_wandb():
    module = types.ModuleType("wandb")
    module.runs = []
    module.init = lambda **kwargs: module.runs.append(FakeWandbRun(**kwargs)) or module.runs[-1]
    module.Table = lambda columns, data: types.SimpleNamespace(columns=columns, data=data)
    return module


def fake_mlflow():
    module = types.ModuleType("mlflow")
    module.calls = []

    def record(name, result=None):
        return lambda *args, **kwargs: module.calls.append((name, args, kwargs)) or result

    module.set_tracking_uri = record("set_tracking_uri")
    module.set_experiment = record("set_experiment")
    module.start_run = record("start_run", types.SimpleNamespace(info=types.SimpleNamespace(run_id="mlflow-run-1")))
    module.log_params = record("log_params")
    module.log_metrics = record("log_metrics")
    module.log_dict = record("log_dict")
    module.end_run = record("end_run")
    return module


@pytest.fixture
def trackers(monkeypatch):
    wandb, mlflow = fake_wandb(), fake_mlflow()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    for name in ("WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    return wandb, mlflow


def calls(mlflow, name):
    return [(args, kwargs) for called, args, kwargs in mlflow.calls if called == name]


def test_wandb_and_mlflow_mirror_metrics_jsonl_and_a_resumed_run_continues_theirs(tmp_path, trackers):
    wandb, mlflow = trackers
    run_dir = tmp_path / "runs" / "grpo-x"
    loggers = "run.loggers=[tensorboard, wandb, mlflow]"
    fit(
        tiny_config("train.rollout_steps=2", "run.save_every=1", loggers),
        run_dir,
        verifier=DigitFraction(),
        show_progress=False,
    )
    records = read_metrics(run_dir / "metrics.jsonl")
    (run,) = wandb.runs
    assert run.init_kwargs["project"] == "reasonrl" and run.init_kwargs["name"] == "grpo-x"
    assert "mode" not in run.init_kwargs  # WANDB_MODE=offline decides, as wandb reads it
    assert run.init_kwargs["dir"] == str(run_dir) and run.init_kwargs["config"]["algo"]["eps_high"] == 0.2
    assert run.init_kwargs["id"] == json.loads((run_dir / "trackers.json").read_text())["wandb_id"]
    samples = [entry for entry in run.logged if "samples" in entry]  # a table of each RL step's samples
    assert [entry["rollout_step"] for entry in samples] == [1, 2]
    assert (
        samples[0]["samples"].columns[:3] == ["step", "prompt", "completion"] and len(samples[0]["samples"].data) == 2
    )
    metrics = [entry for entry in run.logged if "samples" not in entry]
    assert [entry["rollout_step"] for entry in metrics] == [r["step"] for r in records]
    for entry, record in zip(metrics, records, strict=True):
        assert {k: v for k, v in entry.items() if k != "rollout_step"} == {
            k: v for k, v in record.items() if k != "step" and v is not None
        }
    assert ("rollout_step", None) in run.defined and ("reward/*", "rollout_step") in run.defined
    assert run.finished and (run_dir / "tensorboard").is_dir()

    (uri,), _ = calls(mlflow, "set_tracking_uri")[0]
    assert uri == (tmp_path / "runs" / "mlruns").resolve().as_uri()  # a local file store beside the runs
    assert calls(mlflow, "set_experiment")[0][0] == ("reasonrl",)
    assert calls(mlflow, "start_run")[0][1] == {"run_name": "grpo-x"}
    (params,), _ = calls(mlflow, "log_params")[0]
    assert params["algo.eps_high"] == 0.2 and params["run.loggers"] == ["tensorboard", "wandb", "mlflow"]
    logged = calls(mlflow, "log_metrics")
    assert [kwargs["step"] for _, kwargs in logged] == [r["step"] for r in records]
    assert logged[-1][0][0]["reward/mean"] == records[-1]["reward/mean"]
    assert len(calls(mlflow, "end_run")) == 1
    assert [args[1] for args, _ in calls(mlflow, "log_dict")] == [
        "samples/step-000001.json",
        "samples/step-000002.json",
    ]

    fit(tiny_config("train.rollout_steps=3", loggers), run_dir, verifier=DigitFraction(), show_progress=False)
    assert wandb.runs[1].init_kwargs["id"] == run.init_kwargs["id"] and wandb.runs[1].init_kwargs["resume"] == "allow"
    assert calls(mlflow, "start_run")[1][1] == {"run_id": "mlflow-run-1"}  # the same MLflow run continues
    assert len(calls(mlflow, "log_params")) == 1
    assert [e["rollout_step"] for e in wandb.runs[1].logged if "samples" not in e] == [3]


def test_other_streams_get_a_prefix_and_their_own_step_axis(tmp_path, trackers, monkeypatch):
    wandb, mlflow = trackers
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    board, flow = WandbTracker(tmp_path, {}), MlflowTracker(tmp_path, {})
    for tracker in (board, flow):
        tracker.log("value_pretrain", 4, {"critic/value_loss": 0.5})
    assert wandb.runs[0].init_kwargs["project"] == "mine"
    assert wandb.runs[0].logged == [{"value_pretrain_step": 4, "value_pretrain/critic/value_loss": 0.5}]
    assert ("value_pretrain/critic/*", "value_pretrain_step") in wandb.runs[0].defined
    assert calls(mlflow, "log_metrics") == [(({"value_pretrain/critic/value_loss": 0.5},), {"step": 4})]
    assert not calls(mlflow, "set_tracking_uri")  # MLFLOW_TRACKING_URI decides


def test_a_listed_tracker_that_is_not_installed_fails_before_any_model_loads(tmp_path, monkeypatch):
    import reasonrl.training.setup as loop  # where the models load

    monkeypatch.setitem(sys.modules, "wandb", None)  # an import that fails
    monkeypatch.setattr(loop, "load_tokenizer", lambda *a: pytest.fail("a model loaded"))
    with pytest.raises(ConfigError) as caught:
        fit(tiny_config("run.loggers=[wandb]"), tmp_path, show_progress=False)
    assert str(caught.value) == (
        "run.loggers lists wandb, which is not installed: pip install 'reasonrl[wandb]', or remove it from run.loggers"
    )


def test_a_steps_samples_are_a_markdown_table_in_tensorboard(tmp_path):
    from reasonrl.training.record.trackers import TensorBoardTracker, samples_markdown

    samples = [{"prompt": "What is 2+2?", "completion": "4 | four\nAnswer: 4", "reward": 1.0, "correct": True}]
    table = samples_markdown(samples).splitlines()
    assert table[0].startswith("| prompt | completion | reward | correct |")
    assert table[2].startswith("| What is 2+2? | 4 \\| four<br>Answer: 4 | 1.0 | True |")  # one row, pipes escaped
    tracker = TensorBoardTracker(tmp_path)
    tracker.log_samples(1, samples)
    tracker.close()
    assert any(path.stat().st_size > 0 for path in (tmp_path / "tensorboard").glob("events.*"))


def test_a_tensorboard_writer_that_never_stops_does_not_keep_the_run_from_exiting(tmp_path, monkeypatch, caplog):
    """A writer whose thread never got its stop signal (seen after a second Ctrl-C) is left after a bounded wait."""
    import logging
    import threading
    import time

    from reasonrl.training.record import trackers

    never = threading.Event()

    class StuckWriter:
        def close(self):
            never.wait()

    monkeypatch.setattr(trackers, "WRITER_CLOSE_SECONDS", 0.2)
    tracker = trackers.TensorBoardTracker(tmp_path)
    tracker.log("metrics", 1, {"reward/mean": 0.5})  # a real writer, closed normally
    tracker._writers["stuck"] = StuckWriter()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        tracker.close()
    assert time.monotonic() - started < 5
    assert "the TensorBoard writer of stuck did not close within" in caplog.text
    assert "writer of metrics" not in caplog.text and any((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    never.set()


def test_a_tensorboard_writer_whose_close_raises_gives_one_warning_and_no_thread_traceback(
    tmp_path, monkeypatch, caplog
):
    """The closing thread turns what close raises into one warning line (a clean-clone run printed a thread's
    traceback from a writer closed while the interpreter exited, after a second Ctrl-C)."""
    import logging
    import threading

    from reasonrl.training.record import trackers

    class FailingWriter:
        def close(self):
            raise OSError("the event file is gone")

    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    tracker = trackers.TensorBoardTracker(tmp_path)
    tracker._writers["failing"] = FailingWriter()
    with caplog.at_level(logging.WARNING):
        tracker.close()
    assert uncaught == []
    assert "closing a TensorBoard writer failed (the event file is gone)" in caplog.text
