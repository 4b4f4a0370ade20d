"""bench/fidelity_prm.py: the smoke profile end to end (labels, the PRM, ppo and prm_ppo, evaluations by
length) and its resume (a second invocation trains nothing)."""

import json

from tests.bench.smoke import run_smoke


def test_the_prm_benchmark_labels_trains_compares_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    first = run_smoke("fidelity_prm.py", work, out)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((out / "fidelity_prm_smoke.json").read_text())
    assert (out / "fidelity_prm_smoke.png").stat().st_size > 0
    assert result["labelling"]["programs"] == 4 and result["labelling"]["completions_exhaustive"] >= 0
    assert {"held_out_before", "held_out_after"} <= set(result["prm"])
    assert set(result["arms"]) == {"ppo", "prm_ppo"}
    for arm in result["arms"].values():
        assert arm["pass@1"]["functions"]["n"] == 1
    run = result["runs"]["prm_ppo-seed0"]
    assert run["train_metrics"]["reward/prm_dense_mean"][0] is not None  # the PRM rewarded the code rows
    assert result["runs"]["ppo-seed0"]["train_metrics"]["reward/prm_dense_mean"] == [None]  # outcome only
    assert sum(bucket["n"] for bucket in run["eval"]["pass@1_by_length"].values()) == 2
    mtime = (work / "results" / "prm_ppo-seed0.json").stat().st_mtime_ns
    second = run_smoke("fidelity_prm.py", work, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (work / "results" / "prm_ppo-seed0.json").stat().st_mtime_ns == mtime  # nothing trained again
