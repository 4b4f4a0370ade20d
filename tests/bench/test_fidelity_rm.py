"""bench/fidelity_rm.py: the smoke profile end to end (COCA or not, judge vs BT and their policies, reward
hacking by source) and its resume (a second invocation trains nothing)."""

import json

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.slow
def test_the_reward_model_benchmark_runs_every_stage_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    first = run_smoke("fidelity_rm.py", work, out)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((out / "fidelity_rm_smoke.json").read_text())
    assert (out / "fidelity_rm_smoke.png").stat().st_size > 0
    coca = result["per_seed"]["coca"]["0"]
    assert {"as_is", "drop", "reorder"} <= set(coca["plain"]) and coca["plain"]["as_is"]["n"] == 6
    pairwise = result["per_seed"]["pairwise"]["0"]
    assert set(pairwise["runs"]) == {"pairwise_ppo", "ppo_bt"}
    assert 0 <= pairwise["runs"]["ppo_bt"]["referee"]["mean_win_probability"] <= 1
    assert len(pairwise["judge"]["reliability"]) == 5
    runs = result["per_seed"]["hacking"]
    gaps = {arm: by_seed["0"]["train_metrics"]["reward/judge_minus_verifier"] for arm, by_seed in runs.items()}
    assert gaps["verifier"] == [None]  # the verifier's own reward: nothing to compare
    assert gaps["genrm_ground_truth"][0] is not None and gaps["genrm_best_of_n"][0] is not None
    assert result["hacking"]["verifier"]["train_mean"]["mean"] == 0.0
    assert result["hacking"]["genrm_ground_truth"]["train_mean"]["mean"] == gaps["genrm_ground_truth"][0]
    assert 0 <= result["pairwise"]["referee"]["held_out_accuracy"] <= 1 and result["pairwise_seeds"] == [0]
    assert 0 <= result["pairwise"]["referee_base_win_probability"] <= 1
    assert 0 <= result["pairwise"]["calibration_error"]["judge"]["mean"] <= 0.5
    mtime = (work / "results" / "hacking-verifier-seed0.json").stat().st_mtime_ns
    second = run_smoke("fidelity_rm.py", work, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (work / "results" / "hacking-verifier-seed0.json").stat().st_mtime_ns == mtime  # nothing trained again
    (work / "results" / "coca-seed0.json").unlink()  # a stage killed after its reward models were trained
    trained = (work / "coca" / "plain-0" / "summary.json").stat().st_mtime_ns
    third = run_smoke("fidelity_rm.py", work, out)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (work / "results" / "coca-seed0.json").exists()
    assert (work / "coca" / "plain-0" / "summary.json").stat().st_mtime_ns == trained  # not trained again
