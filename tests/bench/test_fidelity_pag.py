"""bench/fidelity_pag.py: the smoke profile end to end (JSON, PNG, every arm evaluated with PAG's protocol) and
its resume (a second invocation trains nothing)."""

import json

from tests.bench.smoke import run_smoke

PAG_KEYS = ("acc@t1", "acc@final", "verifier_accuracy", "delta_i_to_c", "delta_c_to_i", "revision_rate")


def test_the_pag_benchmark_runs_every_arm_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    first = run_smoke("fidelity_pag.py", work, out)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((out / "fidelity_pag_smoke.json").read_text())
    assert (out / "fidelity_pag_smoke.png").stat().st_size > 0
    assert set(result["arms"]) == {"pag", "single_turn", "direct_multiturn"}
    for arm in result["arms"].values():
        assert all(
            arm[key]["n"] == 1 and 0.0 <= arm[key]["mean"] <= 1.0 for key in PAG_KEYS if arm[key]["mean"] is not None
        )
    assert set(result["base"]) == set(PAG_KEYS)
    assert result["tool_grpo"]["tool_calls_mean"]["n"] == 1
    assert result["runs"]["pag-seed0"]["train_metrics"]["multiturn/turns_mean"]  # PAG's own metrics, per step
    mtime = (work / "results" / "pag-seed0.json").stat().st_mtime_ns
    second = run_smoke("fidelity_pag.py", work, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (work / "results" / "pag-seed0.json").stat().st_mtime_ns == mtime  # nothing trained again
