"""bench/vlm_rl.py: the smoke profile end to end (build a tiny VLM, evaluate it, GRPO on a visual task) and
its resume (nothing built or trained again)."""

import pytest

from tests.bench.smoke import smoke_result


@pytest.mark.slow
def test_the_vlm_benchmark_builds_trains_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    result = smoke_result("vlm_rl.py", work, out)
    assert [s["steps"] for s in result["build"]["stages"].values()] == [2, 2, 2, 2]
    assert (
        set(result["base"])
        == set(result["after"])
        == {"visual_arithmetic", "visual_counting", "visual_grounding", "visual_pointing"}
    )
    assert len(result["runs"]["seed0"]["reward"]) == 1
    built = (work / "vlm" / "build.json").stat().st_mtime_ns
    trained = (work / "results" / "grpo-seed0.json").stat().st_mtime_ns
    smoke_result("vlm_rl.py", work, out)
    assert (work / "vlm" / "build.json").stat().st_mtime_ns == built
    assert (work / "results" / "grpo-seed0.json").stat().st_mtime_ns == trained
