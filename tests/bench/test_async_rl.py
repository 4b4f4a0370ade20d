"""bench/async_rl.py on tiny-random: both variants run as a user runs them and report what the benchmark
compares (the synchronous run never waits for a producer; the asynchronous one reports its staleness)."""

import json
import subprocess
import sys

import pytest

from reasonrl.training.record.metrics import read_metrics
from tests.bench.smoke import ROOT

TINY = ["model.name_or_path=tiny-random", "train.rollout_steps=3", "data.eval_prompts=4", "rollout.rollout_prompts=2",
        "rollout.samples_per_prompt=2", "train.minibatch_sequences=2", "algo.dynamic_sampling=false"]  # fmt: skip


@pytest.mark.slow
def test_the_smoke_compares_synchronous_and_asynchronous_runs_of_the_same_seed(tmp_path):
    out = tmp_path / "async.json"
    command = [sys.executable, str(ROOT / "bench" / "async_rl.py"), "--variants", "sync", "async1", "--seeds", "0"]
    done = subprocess.run([*command, "--out", str(out), *TINY], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    sync, async1 = result["runs"]
    assert "error" not in sync and "error" not in async1, (sync, async1)
    assert sync["staleness_mean"] == 0 and 0 <= async1["staleness_mean"] <= 1
    assert [e["step"] for e in sync["evaluations"]] == [e["step"] for e in async1["evaluations"]] == [0, 3]
    assert "rollout.max_staleness=1" in async1["command"] and sync["seconds_to_sync_final_accuracy"] is not None
    assert out.with_suffix(".png").stat().st_size > 0
    kept = read_metrics(tmp_path / "async_async1_seed0_metrics.jsonl")  # each run's own metrics file
    assert [r["step"] for r in kept if "eval/accuracy" in r] == [0, 3]
    assert result["summary"]["async1"]["step_seconds_median"]["values"] == [async1["step_seconds_median"]]
    # --report merges earlier results (an errored run does not replace a complete one) and runs nothing
    failed = dict(result, runs=[dict(sync, error="stopped", evaluations=None)])
    (tmp_path / "later.json").write_text(json.dumps(failed))
    merged = tmp_path / "merged.json"
    report = [*command[:2], "--report", str(out), str(tmp_path / "later.json"), "--out", str(merged)]
    done = subprocess.run(report, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(merged.read_text())["summary"]
    assert summary["sync"]["final_accuracy"]["values"] == [sync["final_accuracy"]]
    assert merged.with_suffix(".png").exists()


def test_the_gpu_profile_trains_the_random_weight_model_it_builds(tmp_path):
    """--profile gpu at its smoke size, on the CPU: the model it builds (Qwen2.5-1.5B's family, the byte-level
    tokenizer) loads and trains as a user's run, and the result says which model it was."""
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(ROOT / "bench" / "async_rl.py"), "--profile", "gpu", "--smoke", "--variants", "sync"]
    settings = ["model.device=cpu", "train.rollout_steps=1", "rollout.max_response_tokens=16", *TINY[2:]]
    done = subprocess.run([*command, "--seeds", "0", "--out", str(out), *settings], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert "error" not in run, run
    assert result["model"] == "random weights, qwen2.5-1.5b's config (smoke size)"
    assert "model.name_or_path=" in run["command"] and "rollout.max_response_tokens=16" in run["command"]
    kept = read_metrics(tmp_path / "gpu_sync_seed0_metrics.jsonl")
    assert [r["step"] for r in kept if "eval/accuracy" in r] == [0, 1]
    assert [r["train/no_signal_step"] for r in kept if r["step"] > 0] == [0.0]  # the length reward: an update
