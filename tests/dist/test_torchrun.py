"""Data parallelism under torchrun (2 gloo processes on the CPU) against one process: the same metrics,
the same weights, the same gradient for every loss aggregation, and a resume after kill -9."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.algo.aggregate import AGGREGATION_MODES
from reasonrl.models.load import load_model
from reasonrl.models.value import load_value_model
from reasonrl.training.record.metrics import read_metrics
from tests.train.test_loop import TINY as LOOP_TINY

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TINY = [*LOOP_TINY, "model.dtype=float32", "run.loggers=[]", "run.eval_every=2"]  # fp32: equal to 1e-5
# binary, so that DAPO meets all-equal groups and refills; ppo: one sample per prompt, the critic learns
PRESETS = {
    "grpo": ["reward.functions=['tests.reward_functions:digit_share']"],
    "dapo": ["reward.functions=['tests.reward_functions:has_digit']"],
    "t_ppo": [
        "reward.functions=['tests.reward_functions:digit_share']",
        "algo.window_tokens=4",
        "algo.value_pretrain_steps=1",
    ],
    "ppo": [
        "reward.functions=['tests.reward_functions:digit_share']",
        "rollout.samples_per_prompt=1",
        "rollout.rollout_prompts=8",
    ],
    # multi-turn: conversations of different lengths split over the ranks, RoleAdvNorm over the whole batch
    "pag": [
        "reward.functions=['tests.reward_functions:digit_share']",
        "rollout.samples_per_prompt=2",
        "rollout.max_conversation_tokens=1200",
        "rollout.max_attempts=2",
    ],
}


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def train_command(ranks: int, preset: str, run_dir: Path, *overrides: str) -> list[str]:
    launcher = TORCHRUN if ranks > 1 else [sys.executable]
    where = [f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}"]
    return [*launcher, "-m", "reasonrl", "train", preset, *TINY, *where, *overrides, "--quiet"]


def train(ranks: int, preset: str, run_dir: Path, *overrides: str) -> None:
    command = train_command(ranks, preset, run_dir, *overrides)
    done = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def learning_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Every metric but timings and memory (perf/), step by step."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(run_dir / "metrics.jsonl")]


def assert_same_run(a: Path, b: Path) -> None:
    ours, theirs = learning_metrics(a), learning_metrics(b)
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        for key, value in mine.items():
            same = value == other[key] or (
                None not in (value, other[key])
                and (math.isclose(value, other[key], abs_tol=1e-5) or (math.isnan(value) and math.isnan(other[key])))
            )
            assert same, (mine["step"], key, value, other[key])
    weights = [load_file(d / "final" / "model.safetensors") for d in (a, b)]
    assert sorted(weights[0]) == sorted(weights[1])
    assert max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0]) < 1e-5


@pytest.mark.parametrize("preset", list(PRESETS))
def test_two_ranks_train_exactly_as_one_process(tmp_path, preset):
    overrides = [*PRESETS[preset], "train.rollout_steps=3"]
    train(1, preset, tmp_path / "one", *overrides)
    train(2, preset, tmp_path / "two", *overrides)
    assert_same_run(tmp_path / "one", tmp_path / "two")
    records = read_metrics(tmp_path / "two" / "metrics.jsonl")
    if preset == "dapo":  # the refill ran: the informative-group count is global
        assert max(r.get("rollout/generation_passes", 0) for r in records) > 1
    if preset == "ppo":
        assert all("critic/value_loss" in r for r in records[1:])
    checkpoint = tmp_path / "two" / "checkpoints" / "step-000003"
    assert (checkpoint / "shards" / ".metadata").exists()  # what a resume loads: every rank's shards
    saved = load_model(str(checkpoint)).state_dict()  # and the whole policy, as one process saves it
    final = load_model(str(tmp_path / "two" / "final")).state_dict()
    assert all(torch.equal(saved[k], final[k]) for k in final)
    if preset == "t_ppo":  # the pretrained critic, gathered from the shards, loads as critic.path
        assert load_value_model(tmp_path / "two" / "critic_pretrained") is not None


def test_a_torchrun_run_resumed_by_one_process_is_refused_with_the_command_that_works(tmp_path):
    overrides = [*PRESETS["grpo"], "train.rollout_steps=1"]
    train(2, "grpo", tmp_path / "run", *overrides)
    command = [*train_command(1, "grpo", tmp_path / "run", *overrides[:-1], "train.rollout_steps=2")]
    done = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "written by 2 data-parallel processes; resume it under torchrun: torchrun --standalone " in done.stderr
    assert "--nproc-per-node 2 -m reasonrl train --resume" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """tests/dist/update_worker.py alone and on 2 ranks: {(mode, world size): result}."""
    out = tmp_path_factory.mktemp("updates")
    worker = [str(REPO / "tests" / "dist" / "update_worker.py"), str(out)]
    for launcher in ([sys.executable], TORCHRUN):
        done = subprocess.run([*launcher, *worker], cwd=REPO, env=environment(), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_a_two_rank_update_has_the_gradient_of_one_process(updates, mode):
    tokens = (updates / "tokens-world2.json").read_text()
    assert len(set(json.loads(tokens))) == 2, f"the ranks should hold different token counts: {tokens}"
    one, two = (torch.load(updates / f"{mode}-world{w}.pt") for w in (1, 2))
    torch.manual_seed(0)
    start = {f"model.{k}": v for k, v in load_model("tiny-random").state_dict().items()}
    step = max((one["weights"][k] - start[k]).abs().max().item() for k in start)  # SGD, lr 1: the gradient
    assert step > 1e-3, "the update did not move the weights"
    apart = max((one["weights"][k] - two["weights"][k]).abs().max().item() for k in start)
    assert apart < 1e-6 * max(1.0, step), mode
    for key in ("loss/policy", "loss/total", "policy/entropy", "policy/clip_frac_high", "train/grad_norm"):
        assert math.isclose(one["metrics"][key], two["metrics"][key], rel_tol=1e-5, abs_tol=1e-6), key


def test_kill_9_after_a_checkpoint_then_resume_matches_an_uninterrupted_run(tmp_path):
    overrides = [*PRESETS["grpo"], "train.rollout_steps=4", "run.save_every=1"]
    train(2, "grpo", tmp_path / "straight", *overrides)
    command = train_command(2, "grpo", tmp_path / "killed", *overrides)
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env=environment(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = tmp_path / "killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(launcher.pid, signal.SIGKILL)  # torchrun and both ranks, mid-run
    launcher.wait()
    assert checkpoint.exists()
    assert not (tmp_path / "killed" / "final").exists(), "the run finished before it could be killed"
    train(2, "grpo", tmp_path / "killed", *overrides)  # the same run directory: resumes from the checkpoint
    assert_same_run(tmp_path / "straight", tmp_path / "killed")


def test_an_asynchronous_run_trains_on_rank_0s_producer_and_resumes(tmp_path):
    """rollout.max_staleness=1 under torchrun: rank 0's producer feeds both ranks, a checkpoint holds the
    prompts of the batches trained (not those made ahead), and the resumed run trains every step once."""
    overrides = [*PRESETS["dapo"], "rollout.max_staleness=1", "run.save_every=2"]
    train(2, "dapo", tmp_path / "run", *overrides, "train.rollout_steps=2")
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["world_size"] == 2
    consumed = state["stream"]["consumed"]
    train(2, "dapo", tmp_path / "run", *overrides, "train.rollout_steps=4")
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # nothing trained twice or skipped
    assert all(0 <= r["rollout/staleness_max"] <= 1 and r["loss/policy"] == r["loss/policy"] for r in records)
    final = json.loads((tmp_path / "run" / "checkpoints" / "step-000004" / "state.json").read_text())
    assert final["stream"]["consumed"] > consumed  # the resumed producer went on from the checkpoint's prompts
    assert load_model(str(tmp_path / "run" / "final")) is not None


def test_a_producer_error_stops_every_rank_with_the_same_one_line_error(tmp_path):
    overrides = ["reward.functions=['tests.reward_functions:always_raises']", "rollout.max_staleness=1"]
    command = train_command(2, "grpo", tmp_path / "run", *overrides, "train.rollout_steps=2")
    done = subprocess.run(command, cwd=REPO, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("reasonrl: error")]
    assert len(said) == 1 and said[0].startswith("reasonrl: error: reward function 'always_raises' failed on all"), said
