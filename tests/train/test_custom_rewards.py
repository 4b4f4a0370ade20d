"""A run scored by custom reward functions named in the config."""

from pathlib import Path

import pytest

from reasonrl.config import ConfigError
from reasonrl.train.loop import fit
from reasonrl.train.metrics import read_metrics
from tests.helpers import DigitFraction
from tests.train.test_loop import tiny_config, undocumented_metrics


def test_a_run_logs_each_function_and_survives_one_that_fails(tmp_path):
    functions = "[verifier, 'tests.reward_functions:digit_share', 'tests.reward_functions:fails_on_odd_length']"
    cfg = tiny_config("train.rollout_steps=2", f"reward.functions={functions}", "reward.weights=[1, 0.5, 1]")
    summary = fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    assert summary["steps"] == 2
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    for record in records:
        assert record["reward/custom/fraction"] == 1.0
        assert 0.0 <= record["reward/fn/digit_share/mean"] <= 1.0
        assert record["reward/fn/verifier/error_fraction"] == 0.0
    failed = [r["reward/fn/fails_on_odd_length/error_fraction"] for r in records]
    assert any(0.0 < f < 1.0 for f in failed), failed  # the tiny model's responses vary in length
    assert all(r["reward/error_fraction"] >= f for r, f in zip(records, failed, strict=True))
    keys = {k.split("/")[2] for r in records for k in r if k.startswith("reward/fn/")}
    assert keys == {"verifier", "digit_share", "fails_on_odd_length"}
    assert not [k for k in undocumented_metrics(tmp_path / "metrics.jsonl") if not k.startswith("reward/fn/")]
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert "`reward/fn/<name>/mean`" in docs and "`reward/fn/<name>/error_fraction`" in docs


def test_a_bad_reward_function_fails_before_any_model_loads(tmp_path, monkeypatch):
    import reasonrl.train.setup as loop  # where the models load

    monkeypatch.setattr(loop, "load_tokenizer", lambda *a: pytest.fail("a model loaded"))
    cfg = tiny_config("reward.functions=['tests.reward_functions:nothing_here']")
    with pytest.raises(ConfigError, match=r"'tests\.reward_functions' has no 'nothing_here'"):
        fit(cfg, tmp_path, show_progress=False)
