"""The `reasonrl` command line: presets, config show, config validate."""

import subprocess
import sys

import pytest

from reasonrl.cli import main


def test_presets_lists_names_descriptions_and_papers(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("dapo", "vapo", "vc_ppo", "t_ppo", "ppo", "grpo", "dr_grpo"):
        assert f"\n{name} " in f"\n{out}"
    assert "arXiv:2503.14476" in out and "arXiv:2504.05118" in out


def test_config_show_prints_resolved_config_and_plan(capsys):
    assert main(["config", "show", "dapo", "algo.eps_high=0.3"]) == 0
    out = capsys.readouterr().out
    assert "  eps_high: 0.3\n" in out
    assert "# sequences_per_rollout: 64" in out
    assert main(["config", "show", "vapo", "--docs"]) == 0
    assert "# μ: weight of the positive-example NLL" in capsys.readouterr().out


def test_config_show_typo_fails_naming_the_key(capsys):
    assert main(["config", "show", "dapo", "algo.eps_hgh=0.3"]) == 2
    assert "did you mean 'algo.eps_high'?" in capsys.readouterr().err


def test_config_validate(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("preset: vapo\nrollout:\n  rollout_prompts: 4\ntrain:\n  minibatch_sequences: 16\n")
    assert main(["config", "validate", str(good)]) == 0
    assert "valid (32 responses and 2 optimiser steps per rollout step" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: vapo\ntrain:\n  minibatch_sequences: 48\n")
    assert main(["config", "validate", str(bad)]) == 2
    assert "train.minibatch_sequences=48 does not divide" in capsys.readouterr().err


def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "reasonrl.cli", "config", "show", "dapo", "algo.eps_hgh=0.3"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "algo.eps_high" in result.stderr


def test_config_validate_checks_the_reward_routes(tmp_path, capsys):
    routes = tmp_path / "routes.yaml"
    routes.write_text("preset: grpo\nreward:\n  routes: ['math=bt']\n")
    assert main(["config", "validate", str(routes)]) == 2
    assert "reward.routes: route math=bt: a verifiable task must be scored by a verifier" in capsys.readouterr().err
    assert main(["train", "grpo", "reward.routes=['math']"]) == 2  # before any model loads
    assert "reward.routes entry 'math' is not 'task_type=source'" in capsys.readouterr().err


def test_eval_refuses_bad_settings_before_loading_and_lists_every_dataset(capsys, monkeypatch):
    import reasonrl.eval

    monkeypatch.setattr(reasonrl.eval, "load_model", lambda *a: pytest.fail("loaded a model"))
    assert main(["eval", "--model", "tiny-random", "--k", "0"]) == 2
    assert capsys.readouterr().err == "reasonrl: error: --k must be >= 1 (samples per problem), got 0\n"
    assert main(["eval", "--model", "tiny-random", "--dataset", "gsm8kk"]) == 1
    assert "did you mean 'gsm8k'?" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny-random", "--dataset", "hh-rlhf-harmless"]) == 1
    assert "only a judge can score" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "arithmetic, gsm8k, math500, aime2024, humaneval, mbpp, functions, visual_arithmetic," in help_text
    assert "--question-field" in help_text
