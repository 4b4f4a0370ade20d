"""dist.backend=ray end to end on a local 2-CPU cluster: 2 rollout workers and 1 trainer worker train
exactly as one process, an asynchronous run's producer generates on them, and a rollout worker killed
mid-run stops the run with an error naming it."""

import threading
import time

import pytest

ray = pytest.importorskip("ray")

from reasonrl.cli import main  # noqa: E402
from reasonrl.config import load_config  # noqa: E402
from reasonrl.dist import WorkerDiedError  # noqa: E402
from reasonrl.dist.ray_training import fit_on_ray  # noqa: E402
from reasonrl.training.loop import fit  # noqa: E402
from reasonrl.training.record.metrics import read_metrics  # noqa: E402
from tests.dist.test_torchrun import PRESETS, TINY, assert_same_run  # noqa: E402

pytestmark = pytest.mark.ray
RAY = ["dist.backend=ray", "dist.rollout_workers=2", "dist.trainer_workers=1", "dist.worker_timeout_seconds=300"]


def config(*overrides):
    return load_config("grpo", [*TINY, *PRESETS["grpo"], *overrides])


@pytest.mark.parametrize("trainers", [1, 2])
def test_rollout_and_trainer_workers_train_exactly_as_one_process(cluster, tmp_path, trainers):
    fit(config("train.rollout_steps=3"), tmp_path / "one", preset="grpo", show_progress=False)
    ray_run = config("train.rollout_steps=3", *RAY, f"dist.trainer_workers={trainers}")
    summary = fit_on_ray(ray_run, tmp_path / "ray", preset="grpo")
    assert summary["steps"] == 3
    assert_same_run(tmp_path / "one", tmp_path / "ray")


def test_a_ray_run_prints_the_lines_of_a_run_in_one_process(cluster, tmp_path, capsys):
    """The accuracy it starts from, a line per step and per checkpoint (rank 0's log, through Ray), the summary."""
    run = ["train", "grpo", *TINY, *RAY, "dist.rollout_workers=1", "train.rollout_steps=2", "run.save_every=1"]
    assert main([*run, f"run.output_dir={tmp_path}", "run.name=r"]) == 0
    out, err = capsys.readouterr()
    deadline = time.monotonic() + 10  # Ray passes a worker's lines on a moment later
    while "saved the checkpoint of step 2" not in err and time.monotonic() < deadline:
        time.sleep(0.5)
        err += capsys.readouterr().err
    assert "held-out accuracy before training: " in err
    assert "RL step 1/2" in err and "RL step 2/2" in err
    for step in (1, 2):
        assert f"saved the checkpoint of step {step}: {tmp_path / 'r' / 'checkpoints'}/step-00000{step}" in err
    assert "held-out accuracy: " in out and f"model:   {tmp_path / 'r' / 'final'}" in out


@pytest.mark.parametrize("trainers", [1, 2])
def test_an_asynchronous_run_generates_on_the_rollout_workers_within_its_staleness_bound(cluster, tmp_path, trainers):
    """rollout.max_staleness=1 with partial rollouts: rank 0's producer thread generates on the two rollout
    workers, which evaluation shares, in windows that take the newest weights between them; every rank trains
    on the batches rank 0 broadcasts."""
    partial = ["rollout.partial_rollouts=true", "rollout.partial_window_tokens=4"]
    asynchronous = ["rollout.max_staleness=1", "rollout.producer_timeout_seconds=300", *partial]
    cfg = config("train.rollout_steps=3", *RAY, f"dist.trainer_workers={trainers}", *asynchronous)
    assert fit_on_ray(cfg, tmp_path, preset="grpo")["steps"] == 3
    records = read_metrics(tmp_path / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert "eval/accuracy" in records[0] and "eval/accuracy" in steps[1]  # run.eval_every=2
    for r in steps:
        assert 0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1
        assert r["rollout/staleness_0_fraction"] + r["rollout/staleness_1_fraction"] == pytest.approx(1.0)
    assert sum(r["rollout/reprefill_tokens"] for r in steps) > 0  # responses continued across windows


@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_a_killed_rollout_worker_stops_the_run_naming_it_and_the_checkpoint(cluster, tmp_path, staleness):
    run_dir = tmp_path / "run"
    outcome: dict = {}
    cfg = config("train.rollout_steps=50", "run.save_every=1", *RAY, f"rollout.max_staleness={staleness}")

    def train():
        try:
            fit_on_ray(cfg, run_dir, preset="grpo")
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=train)
    thread.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (run_dir / "checkpoints" / "latest").exists():
        time.sleep(0.2)
    assert (run_dir / "checkpoints" / "latest").exists(), "no checkpoint within 10 minutes"
    rollout = [n for n in ray.util.list_named_actors() if n.startswith("reasonrl-rollout-1-")]
    assert rollout, "no rollout worker to kill"
    ray.kill(ray.get_actor(rollout[0]))
    thread.join(timeout=120)
    assert not thread.is_alive(), "the run hung after its rollout worker died"
    error = outcome.get("error")
    assert isinstance(error, WorkerDiedError), repr(error)
    assert "rollout worker 1 of 2" in str(error) and "died" in str(error)
    assert "the last checkpoint is " + str(run_dir / "checkpoints" / "step-") in str(error)
    assert len(read_metrics(run_dir / "metrics.jsonl")) < 51
