"""A run scored by custom reward functions named in the config."""

import re
from pathlib import Path

import pytest

from reasonrl.cli import main
from reasonrl.config import ConfigError
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY, tiny_config, undocumented_metrics


def train(tmp_path, *overrides):
    """``reasonrl train`` of a tiny 2-step run, as a user runs it; the exit status."""
    command = ["train", "grpo", *TINY, "train.rollout_steps=2", f"run.output_dir={tmp_path / 'runs'}", *overrides]
    return main([*command, "--quiet"])


def test_a_function_that_fails_on_every_call_stops_the_run_with_its_traceback_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the log's lines unwrapped, whatever the length of tmp_path
    source = tmp_path / "raises.py"
    source.write_text("def reverse_reward(prompts, completions, **kwargs):\n    return [float({}['reverse'])]\n")
    assert train(tmp_path, f"reward.functions=['{source}:reverse_reward']") == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("reasonrl: error")] == [
        "reasonrl: error: reward function 'reverse_reward' failed on all 16 calls at step 1 (first: KeyError: "
        "'reverse'; logged above); the run stopped rather than train on its zeros"
    ]
    assert err.count(f'File "{source}", line 2, in reverse_reward') == 1  # the first failure's traceback
    assert err.count("failed on response") == 1  # and no warning per response


def test_the_share_of_failed_calls_that_stops_a_run_is_a_setting(tmp_path, capsys):
    fails_sometimes = "reward.functions=['tests.reward_functions:fails_on_odd_length']"
    assert train(tmp_path, fails_sometimes, "reward.max_error_fraction=0.05") == 1
    assert re.search(
        r"reasonrl: error: reward function 'fails_on_odd_length' failed on \d+ of 16 calls at step 1, \d+% >= "
        r"reward.max_error_fraction=0.05 \(first: TypeError: returned 'odd length'; a reward is a finite number",
        capsys.readouterr().err,
    )
    assert train(tmp_path, fails_sometimes, "reward.max_error_fraction=0") == 2
    assert "reward.max_error_fraction must be > 0" in capsys.readouterr().err


def test_a_run_logs_each_function_and_survives_one_that_fails(tmp_path, caplog):
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
    # without dynamic sampling every call is in the trained batch of 16: the count per step is its share
    assert [r["reward/fn/fails_on_odd_length/errors"] for r in records] == [16 * f for f in failed]
    assert caplog.text.count("returned a value that is no reward") == 1  # the first failure alone is logged
    keys = {k.split("/")[2] for r in records for k in r if k.startswith("reward/fn/")}
    assert keys == {"verifier", "digit_share", "fails_on_odd_length"}
    assert not [k for k in undocumented_metrics(tmp_path / "metrics.jsonl") if not k.startswith("reward/fn/")]
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert all(f"`reward/fn/<name>/{key}`" in docs for key in ("mean", "error_fraction", "errors"))


def test_a_bad_reward_function_fails_before_any_model_loads(tmp_path, monkeypatch):
    import reasonrl.training.setup as loop  # where the models load

    monkeypatch.setattr(loop, "load_tokenizer", lambda *a: pytest.fail("a model loaded"))
    cfg = tiny_config("reward.functions=['tests.reward_functions:nothing_here']")
    with pytest.raises(ConfigError, match=r"'tests\.reward_functions' has no 'nothing_here'"):
        fit(cfg, tmp_path, show_progress=False)
