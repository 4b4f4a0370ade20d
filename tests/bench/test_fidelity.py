"""bench/fidelity.py: the smoke profile end to end (JSON, PNG, targets, resume), and its statistics and overrides."""

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "fidelity.py"


def load_harness():
    spec = importlib.util.spec_from_file_location("fidelity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fidelity = load_harness()
CONFIG, _ = fidelity.load_harness_config(fidelity.CONFIG)


def harness(work: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, str(SCRIPT), "--profile", "smoke", "--work", str(work), "--out", str(out), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_the_smoke_profile_runs_end_to_end_and_a_second_invocation_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    first = harness(work, out)
    assert first.returncode == 0, first.stderr
    result = json.loads((out / "fidelity_smoke.json").read_text())
    assert (out / "fidelity_smoke.png").stat().st_size > 0
    # the targets fixed in bench/fidelity.yaml travel with the results, each with a verdict
    assert result["config_sha256"] == hashlib.sha256(fidelity.CONFIG.read_bytes()).hexdigest()
    assert [t["id"] for t in result["targets"]] == [t["id"] for t in CONFIG["targets"]]
    assert result["config"]["targets"] == CONFIG["targets"]
    verdicts = {"reproduced", "partly", "not reproduced", "not testable"}
    assert all(t["verdict"] in verdicts and "threshold" in t for t in result["targets"])
    assert result["runs_done"] == result["runs_planned"] == 2
    assert result["arms"]["ppo"]["final_accuracy"]["n"] == result["arms"]["t_ppo"]["final_accuracy"]["n"] == 1
    assert "critic.init=reward_model" in result["runs"]["ppo-seed0"]["overrides"]
    assert "reward.incorrect_score=-1.0" in result["runs"]["t_ppo-seed0"]["overrides"]
    assert result["reward_model"]["summary"]["max_response_tokens"] == 7  # the 6-token cap + EOS
    assert result["race"]["per_seed"]["0"]["modes"]["pool"]["completed"] >= 4
    assert result["runs"]["t_ppo-seed0"]["metrics"]["perf/step_seconds"]["mean"] > 0
    assert not (work / "runs" / "ppo-seed0" / "checkpoints").exists()  # a finished run's large files are pruned

    # started again (say after a kill that lost t_ppo's result file): nothing runs again
    kept = json.loads((work / "results" / "ppo-seed0.json").read_text())
    mtime = (work / "results" / "ppo-seed0.json").stat().st_mtime_ns
    (work / "results" / "t_ppo-seed0.json").unlink()
    second = harness(work, out)
    assert second.returncode == 0, second.stderr
    for name in ("rm", "race seed 0", "ppo-seed0"):
        assert f"fidelity: {name}: finished before, skipped" in second.stderr
    assert "done in" not in second.stderr  # t_ppo's result is read back from its finished run directory
    assert (work / "results" / "ppo-seed0.json").stat().st_mtime_ns == mtime
    again = json.loads((out / "fidelity_smoke.json").read_text())
    assert again["runs_done"] == 2 and again["runs"]["ppo-seed0"] == kept
    assert again["runs"]["t_ppo-seed0"] == result["runs"]["t_ppo-seed0"]

    # the targets are fixed before the runs: another configuration refuses this work directory
    changed = tmp_path / "changed.yaml"
    changed.write_text(fidelity.CONFIG.read_text().replace("threshold: 0.0", "threshold: -1.0"))
    refused = harness(work, out, "--config", str(changed))
    assert refused.returncode != 0 and "targets are fixed before runs" in refused.stderr


def test_verdicts_follow_the_rule_fixed_in_the_config():
    assert fidelity.verdict(0.10, 0.02, 3, 0.0) == "reproduced"  # d - 2 SE = 0.06 > 0
    assert fidelity.verdict(0.10, 0.06, 3, 0.0) == "partly"  # right direction, within two SE
    assert fidelity.verdict(-0.01, 0.01, 3, 0.0) == "not reproduced"
    assert fidelity.verdict(1.3, 0.1, 3, 1.0) == "reproduced"  # a ratio against 1
    assert fidelity.verdict(0.5, None, 1, 0.0) == "not testable"  # one seed: no standard error
    stats = fidelity.mean_se([0.1, 0.2, 0.3, None])
    assert stats["mean"] == pytest.approx(0.2) and stats["n"] == 3
    assert stats["se"] == pytest.approx(0.1 / math.sqrt(3))


def run(arm, seed, accuracy, curve=None, **metrics):
    return {
        "arm": arm,
        "seed": seed,
        "final_accuracy": accuracy,
        "accuracy_before": 0.1,
        "accuracy_curve": curve or [[0.0, 0, 0.1], [10.0, 1, accuracy]],
        "metrics": {k: {"first": v, "mean": 2 * v, "last": v} for k, v in metrics.items()},
    }


def test_targets_pair_arms_by_seed():
    runs = {
        ("a", 0): run("a", 0, 0.5, **{"m/x": 1.0, "m/y": 0.25}),
        ("a", 1): run("a", 1, 0.7),
        ("b", 0): run("b", 0, 0.25, **{"m/x": 4.0}),
        ("b", 1): run("b", 1, 0.5),
    }
    accuracy = {"kind": "difference", "metric": "final_accuracy", "a": "a", "b": "b"}
    difference = fidelity.target_values(accuracy, runs, {}, [0, 1, 2])
    assert difference[0] == pytest.approx(0.25) and difference[1] == pytest.approx(0.2) and difference[2] is None
    first = {"kind": "difference", "metric": "m/x", "stat": "first", "a": "a", "b": "b"}
    assert fidelity.target_values(first, runs, {}, [0, 1]) == {0: -3.0, 1: None}  # seed 1 logged no m/x
    within = {"kind": "within", "arm": "a", "metric": "m/x", "minus": "m/y", "stat": "mean"}
    assert fidelity.target_values(within, runs, {}, [0]) == {0: 1.5}
    race = {0: {"modes": {"pool": {"rate": 3.0}, "synchronous": {"rate": 2.0}}}}
    ratio = {"kind": "ratio", "metric": "race/rate", "a": "pool", "b": "synchronous"}
    assert fidelity.target_values(ratio, runs, race, [0, 1]) == {0: 1.5, 1: None}


def test_time_to_accuracy_uses_the_synchronous_runs_best_accuracy():
    sync = run("s", 0, 0.4, curve=[[0.0, 0, 0.1], [100.0, 2, 0.3], [200.0, 4, 0.4]])
    fast = run("t", 0, 0.45, curve=[[0.0, 0, 0.1], [40.0, 4, 0.2], [80.0, 8, 0.45]])
    never = run("t", 1, 0.2, curve=[[0.0, 0, 0.1], [80.0, 8, 0.2]])
    flat = run("s", 2, 0.1, curve=[[0.0, 0, 0.1], [100.0, 2, 0.1]])
    runs = {("s", 0): sync, ("t", 0): fast, ("s", 1): sync, ("t", 1): never, ("s", 2): flat, ("t", 2): fast}
    measure = {"kind": "ratio", "metric": "seconds_to_sync_best_accuracy", "a": "s", "b": "t"}
    # 200 s vs 80 s to 0.4; never reached: 0; the synchronous run did not learn: nothing to time
    assert fidelity.target_values(measure, runs, {}, [0, 1, 2]) == {0: 2.5, 1: 0.0, 2: None}


@pytest.mark.parametrize("profile", sorted(CONFIG["profiles"]))
def test_every_arm_of_every_profile_is_a_valid_run(profile, tmp_path):
    settings = CONFIG["profiles"][profile]
    for arm in fidelity.selected_arms(CONFIG, settings, None):
        overrides = fidelity.train_overrides(CONFIG, settings, arm, 0, tmp_path)
        cfg = load_config(CONFIG["arms"][arm]["preset"], overrides)
        assert (cfg.reward.correct_score, cfg.reward.incorrect_score) == (1.0, -1.0), arm
        family = settings[CONFIG["arms"][arm]["family"]]
        assert cfg.rollout.rollout_prompts * cfg.rollout.samples_per_prompt == family["prompts"] * family["samples"]
        if CONFIG["arms"][arm]["family"] == "value":
            assert (cfg.critic.init, cfg.critic.path) == ("reward_model", str(tmp_path / "rm")), arm
        if profile != "smoke":
            assert cfg.rollout.max_response_tokens >= (256 if CONFIG["arms"][arm]["family"] == "value" else 512)


def test_arms_outside_the_profile_are_refused():
    with pytest.raises(SystemExit, match=r"arm\(s\) vapo not in this profile; choose from ppo, t_ppo"):
        fidelity.selected_arms(CONFIG, CONFIG["profiles"]["smoke"], ["vapo"])
    assert fidelity.selected_arms(CONFIG, CONFIG["profiles"]["cpu"], ["t_ppo", "ppo"]) == ["ppo", "t_ppo"]


def test_the_arms_change_what_their_names_say():
    profile = CONFIG["profiles"]["cpu"]

    def algo(arm):
        overrides = fidelity.train_overrides(CONFIG, profile, arm, 0, Path("w"))
        return load_config(CONFIG["arms"][arm]["preset"], overrides).algo

    vapo = algo("vapo")
    assert vapo.length_alpha == 0.05 and vapo.value_pretrain_steps == profile["value"]["value_pretrain_steps"]
    assert algo("ppo").value_pretrain_steps == 0  # PPO's critic is the reward model as it is
    assert algo("vapo_no_value_pretrain").value_pretrain_steps == 0
    assert algo("vapo_alpha5").length_alpha == 5.0
    assert algo("t_ppo").window_tokens == math.ceil(profile["tppo"]["cap"] / 3)
    assert algo("t_ppo_sync").window_tokens is None and algo("t_ppo_sync").advantage_estimator == "gae"
    for arm, spec in CONFIG["arms"].items():  # an ablation differs from VAPO in its own overrides only
        if spec.get("ablation_of") == "vapo" and spec["sampling"] == "group":
            changed = {f for f in vapo.__dataclass_fields__ if getattr(algo(arm), f) != getattr(vapo, f)}
            assert changed and changed <= {o.split("=")[0].removeprefix("algo.") for o in spec["overrides"]}, arm


def test_a_reference_solution_becomes_an_answer_in_the_prompts_format():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert fidelity.reference_response(solution, "answer_line") == "Natalia sold 48/2 = 24 clips in May.\nAnswer: 72"
    assert fidelity.reference_response(solution, "boxed").endswith("The final answer is \\boxed{72}.")


def test_the_markdown_report_has_one_table_per_paper_with_each_target_and_its_verdict():
    targets = [
        {
            "id": "a_beats_b",
            "paper": "P1",
            "claim": "A | B",
            "threshold": 0.0,
            "verdict": "reproduced",
            "d": 0.1,
            "se": 0.02,
            "n": 3,
            "per_seed": {"0": 0.1, "1": 0.12, "2": None},
            "measure": {"kind": "difference", "metric": "final_accuracy", "a": "a", "b": "b"},
        },
        {
            "id": "lam",
            "paper": "P2",
            "claim": "c",
            "threshold": 1.0,
            "verdict": "not testable",
            "d": None,
            "se": None,
            "n": 0,
            "per_seed": {"0": None},
            "measure": {"kind": "within", "arm": "a", "metric": "x", "minus": "y", "stat": "mean"},
        },
    ]
    result = {"profile": "cpu", "runs_done": 2, "runs_planned": 3, "updated": "today", "targets": targets}
    text = fidelity.markdown_report(result)
    assert text.count("| target | claim |") == 2 and "**P1**" in text and "**P2**" in text
    assert "| a_beats_b | A \\| B | final_accuracy: a − b | 0.1 ± 0.02 (3) | 0.1, 0.12, – | 0 | reproduced |" in text
    assert "| lam | c | a: x[mean] − y[mean] | – ± – (0) | – | 1 | not testable |" in text
