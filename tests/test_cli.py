"""The `reasonrl` command line: presets, config show, config validate."""

import subprocess
import sys
from pathlib import Path

import pytest

import reasonrl
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


def test_python_m_runs_from_the_directory_that_holds_the_clone(tmp_path):
    """A clone named reasonrl in the working directory is a namespace package to Python, whose ``__init__``
    never runs (with the editable install of `make`, the modules still come from the clone)."""
    (tmp_path / "reasonrl").symlink_to(Path(reasonrl.__file__).parent.parent, target_is_directory=True)
    command = [sys.executable, "-m", "reasonrl", "config", "show", "dapo", "algo.eps_hgh=0.3"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (
        2,
        "reasonrl: error: unknown config key 'algo.eps_hgh'; did you mean 'algo.eps_high'?\n",
    )


def test_config_validate_checks_the_reward_routes(tmp_path, capsys):
    routes = tmp_path / "routes.yaml"
    routes.write_text("preset: grpo\nreward:\n  routes: ['math=bt']\n")
    assert main(["config", "validate", str(routes)]) == 2
    assert "reward.routes: route math=bt: a verifiable task must be scored by a verifier" in capsys.readouterr().err
    assert main(["train", "grpo", "reward.routes=['math']"]) == 2  # before any model loads
    assert "reward.routes entry 'math' is not 'task_type=source'" in capsys.readouterr().err


def test_eval_refuses_bad_settings_before_loading_and_lists_every_dataset(capsys, monkeypatch):
    import reasonrl.jobs.evaluate

    monkeypatch.setattr(reasonrl.jobs.evaluate, "load_model", lambda *a: pytest.fail("loaded a model"))
    assert main(["eval", "--model", "tiny-random", "--k", "0"]) == 2
    assert capsys.readouterr().err == "reasonrl: error: --k must be >= 1 (samples per problem), got 0\n"
    assert main(["eval", "--model", "tiny-random", "--dataset", "gsm8kk"]) == 1
    assert "did you mean 'gsm8k'?" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny-random", "--dataset", "hh-rlhf-harmless"]) == 1
    assert "only a judge can score" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "arithmetic, gsm8k, math500, aime2024, humaneval, mbpp, functions, countdown, guess_number, visual_arithmetic,"
    ) in help_text
    assert "--question-field" in help_text


def test_dist_backend_ray_without_ray_installed_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # an import that fails
    ray_run = ["model.name_or_path=tiny-random", "dist.backend=ray", f"run.output_dir={tmp_path}", "--quiet"]
    assert main(["train", "grpo", *ray_run]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "reasonrl: error: dist.backend=ray needs Ray, which is not installed: pip install 'reasonrl[ray]', "
        "or use another dist.backend"
    )
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_config_validate_without_a_file_says_what_to_give(capsys):
    assert main(["config", "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reasonrl: error: config validate checks a config file: reasonrl config validate FILE ")
    assert "e.g. `reasonrl config validate my_run.yaml train.rollout_steps=20`" in err and "`preset: dapo`" in err
    assert main(["config", "validate", "train.rollout_steps=20"]) == 2  # an override where the file belongs
    assert "config validate checks a config file" in capsys.readouterr().err


def test_config_validate_reports_every_bad_key_and_value_at_once(tmp_path, capsys):
    config = tmp_path / "typos.yaml"
    config.write_text("preset: grpo\nalgo:\n  eps_hgh: 0.3\ntrain:\n  lrr: 1e-6\n  rollout_steps: many\n")
    assert main(["config", "validate", str(config), "rollout.temprature=0.7"]) == 2
    assert capsys.readouterr().err == (
        "reasonrl: error: invalid configuration:\n"
        "  - unknown config key 'algo.eps_hgh'; did you mean 'algo.eps_high'?\n"
        "  - unknown config key 'train.lrr'; did you mean 'train.lr'?\n"
        "  - unknown config key 'rollout.temprature'; did you mean 'rollout.temperature'?\n"
        "  - train.rollout_steps: expected an integer, got 'many'\n"
    )


def test_a_response_cap_of_zero_is_one_problem_not_also_fires(capsys):
    assert main(["config", "validate", "grpo", "rollout.max_response_tokens=0"]) == 2
    assert capsys.readouterr().err == (
        "reasonrl: error: invalid configuration:\n  - rollout.max_response_tokens must be >= 1\n"
    )


def test_an_unknown_preset_and_a_misspelt_reward_function_get_did_you_mean(tmp_path, capsys):
    assert main(["train", "dapoo"]) == 2
    assert (
        "reasonrl: error: unknown preset 'dapoo'; did you mean 'dapo'? (presets: countdown, dapo, "
    ) in capsys.readouterr().err
    misspelt = "reward.functions=['tests/reward_functions.py:digit_shar']"
    assert main(["train", "grpo", "model.name_or_path=tiny-random", misspelt, f"run.output_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("has no 'digit_shar'; did you mean 'digit_share'?")


def test_a_missing_question_field_names_the_setting_of_the_command(tmp_path, capsys):
    rows = tmp_path / "qa.jsonl"
    rows.write_text('{"problem": "What is 1 + 1?", "solution": "2"}\n')
    fix = "no field 'question' (fields present: problem, solution); set {} to the field that holds the question"
    assert main(["eval", "--model", "tiny-random", "--dataset", str(rows)]) == 1
    assert capsys.readouterr().err == f"reasonrl: error: {rows}:1: {fix.format('--question-field')}\n"
    train = ["train", "grpo", "model.name_or_path=tiny-random", f"data.dataset={rows}", f"run.output_dir={tmp_path}"]
    assert main(train) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"reasonrl: error: {rows}:1: {fix.format('data.question_field')}"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("reasonrl.training.record.run_health:RunHealthError", 1),
        ("reasonrl.training.record.trackers:TrackerError", 1),
        ("reasonrl.reward.custom:RewardFunctionError", 1),
        ("reasonrl.dist.cluster_errors:WorkerDiedError", 1),
        ("reasonrl.config:ConfigError", 2),
    ],
)
def test_every_error_a_run_raises_for_its_user_is_one_line_with_its_exit_status(
    error, status, tmp_path, capsys, monkeypatch
):
    import importlib

    import reasonrl
    import reasonrl.training.loop

    module, name = error.split(":")
    kind = getattr(importlib.import_module(module), name)
    assert issubclass(kind, reasonrl.ReasonRLError)  # what a caller of the Python API catches

    def fails(*args, **kwargs):
        raise kind("the reward has not moved for 5 steps; see summary.md")

    monkeypatch.setattr(reasonrl.training.loop, "fit", fails)
    assert main(["train", "grpo", "model.name_or_path=tiny-random", f"run.output_dir={tmp_path}", "--quiet"]) == status
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "reasonrl: error: the reward has not moved for 5 steps; see summary.md"
    assert "Traceback" not in err
