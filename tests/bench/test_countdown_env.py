"""bench/countdown_env.py: the smoke profile end to end (JSON, PNG, held-out episodes before and after, the
training episodes' metrics per step)."""

from tests.bench.smoke import smoke_result


def test_the_countdown_benchmark_reports_episodes_before_and_after(tmp_path):
    result = smoke_result("countdown_env.py", tmp_path / "work", tmp_path / "out")
    for when in ("before", "after"):
        assert set(result[when]) == {
            "success_rate", "tool_calls_per_episode", "turns_per_episode", "generated_tokens_per_episode",
            "tool_errors_per_episode",
        }  # fmt: skip
        assert 0.0 <= result[when]["success_rate"]["mean"] <= 1.0 and result[when]["turns_per_episode"]["mean"] >= 1
    run = result["runs"]["seed0"]
    assert run["evaluated_steps"] == [0, 1] and len(run["train"]["success_rate"]) == 1
    assert run["train"]["generated_tokens_per_episode"][0] > 0
