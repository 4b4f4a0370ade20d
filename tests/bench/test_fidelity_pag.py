"""bench/fidelity_pag.py: the smoke profile end to end (JSON, PNG, every arm evaluated with PAG's protocol) and
its resume (a second invocation trains nothing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "fidelity_pag.py"
PAG_KEYS = ("acc@t1", "acc@final", "verifier_accuracy", "delta_i_to_c", "delta_c_to_i", "revision_rate")


def bench(work: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, str(SCRIPT), "--profile", "smoke", "--seeds", "0", "--steps", "1", "--work", str(work)]
    return subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)


def test_the_pag_benchmark_runs_every_arm_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    first = bench(work, out)
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
    second = bench(work, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (work / "results" / "pag-seed0.json").stat().st_mtime_ns == mtime  # nothing trained again
