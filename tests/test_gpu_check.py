"""scripts/gpu_check.py (behind scripts/gpu-check.sh): the GPU checks for machines without a network. Their whole
run, offline in a stand-in for the GPU image, is shown in docs/gpu-checks.md; these tests cover its parts."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)


def check_in(out: Path, budget: float = 60) -> "gpu_check.Check":
    out.mkdir(parents=True, exist_ok=True)
    return gpu_check.Check(out, out / "site", out / "wheels", budget)


def test_junit_results_give_each_tests_outcome_and_why(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent("""
        import pytest

        def test_passes():
            assert True

        def test_fails():
            assert 1 == 2, "one is not two"

        @pytest.mark.skip(reason="needs a CUDA device")
        def test_skips():
            pass
        """)
    )
    (tmp_path / "test_broken.py").write_text("import no_such_module_on_this_image\n")
    junit = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", *gpu_check.PYTEST_OPTIONS, f"--junitxml={junit}"]
    subprocess.run(command, cwd=tmp_path, capture_output=True, check=False)
    results = gpu_check.junit_results(junit)
    assert results["counts"] == {"passed": 1, "failed": 1, "error": 1, "skipped": 1}
    outcomes = {test["id"]: test for test in results["tests"]}
    assert outcomes["test_sample::test_passes"]["outcome"] == "passed"
    assert "one is not two" in outcomes["test_sample::test_fails"]["message"]
    assert outcomes["test_sample::test_skips"]["message"] == "needs a CUDA device"
    (broken,) = [test for test in results["tests"] if test["outcome"] == "error"]
    assert "no_such_module_on_this_image" in broken["message"]  # a collection error names the missing import


def test_unmet_requirements_name_missing_packages_and_refused_versions():
    numpy = gpu_check.installed_version("numpy")
    missing = "no-such-package"
    not_here = [f"{missing}; extra == 'gpu'", f"{missing}; python_version < '3'"]  # markers that do not apply
    requirements = ["numpy>=1", "numpy<1", f"{missing}>=2", *not_here]
    assert gpu_check.unmet_requirements(requirements) == [
        f"numpy: {numpy} installed, <1 wanted",
        f"{missing}: not installed (wanted >=2)",
    ]


def test_a_step_past_its_budget_is_stopped_with_the_processes_it_started(tmp_path):
    marker = tmp_path / "grandchild-survived"
    grandchild = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"
    check = check_in(tmp_path / "out")
    started = time.monotonic()
    result = check.step("slow", [sys.executable, "-c", child], budget=1)
    assert result["status"] == "timed_out" and time.monotonic() - started < 10
    time.sleep(4)
    assert not marker.exists()
    recorded = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert recorded["steps"] == [result]


def test_a_step_that_would_start_after_the_deadline_is_skipped_with_a_note(tmp_path):
    check = check_in(tmp_path / "out", budget=gpu_check.RESERVE_SECONDS + 1)
    result = check.step("late", [sys.executable, "-c", "raise SystemExit('must not run')"])
    assert result["status"] == "skipped" and result["note"].startswith("no time left")


@pytest.mark.parametrize("present", [False, True])
def test_the_training_side_benchmark_runs_where_it_exists_and_is_skipped_where_not(tmp_path, monkeypatch, present):
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    if present:  # a stand-in that writes its JSON where --out says, as bench/train_side.py does
        (tmp_path / "bench").mkdir()
        (tmp_path / "bench" / "train_side.py").write_text(
            "import argparse, json, os, pathlib\n"
            "parser = argparse.ArgumentParser(); parser.add_argument('--profile'); parser.add_argument('--out')\n"
            "args = parser.parse_args(); pathlib.Path(args.out).mkdir(parents=True)\n"
            "result = {'profile': args.profile, 'seconds': int(os.environ['GPU_CHECK_STEP_SECONDS'])}\n"
            "(pathlib.Path(args.out) / 'train_side_gpu.json').write_text(json.dumps(result))\n"
        )
    out = tmp_path / "out"
    check_in(out).run_benchmarks(sys.executable, ["train_side"])
    (step,) = json.loads((out / "gpu_check.json").read_text())["steps"]
    if present:
        assert step["status"] == "passed"
        result = json.loads((out / "train_side" / "train_side_gpu.json").read_text())
        assert result["profile"] == "gpu" and 0 < result["seconds"] <= 60  # the rest of the check's 60 s budget
    else:
        assert step["status"] == "skipped" and "bench/train_side.py is not in this tree" in step["note"]


def test_without_a_gpu_the_device_is_the_cpu_and_says_so():
    info = gpu_check.device_info()
    if info["cuda_available"] or info["nvidia_smi"]:
        pytest.skip("this machine has a GPU")
    assert info["device"].startswith("cpu") and info["torch_device_name"] is None
    assert info["torch"] and info["transformers"]


def test_the_wheelhouse_pins_versions_that_pyproject_accepts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    specifiers = {Requirement(r).name.lower(): Requirement(r).specifier for r in declared if "reasonrl" not in r}
    lines = (ROOT / "scripts" / "wheelhouse.txt").read_text().splitlines()
    pins = [Requirement(re.sub(r"\s+#.*", "", line)) for line in lines if line.strip() and not line.startswith("#")]
    assert {"math-verify", "gguf", "tensorboardx", "trl"} <= {pin.name.lower() for pin in pins}
    for pin in pins:
        (version,) = (specifier.version for specifier in pin.specifier)
        wanted = specifiers.get(pin.name.lower())
        assert wanted is None or wanted.contains(version), f"{pin} is outside pyproject's {pin.name}{wanted}"


def test_the_wheels_go_to_a_fresh_private_folder_of_this_run_never_a_fixed_shared_one(tmp_path, monkeypatch):
    planted = tmp_path / "reasonrl-site"  # what another user could make at the old fixed /tmp/reasonrl-site
    planted.mkdir()
    marker = tmp_path / "planted-code-ran"
    (planted / "sitecustomize.py").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    monkeypatch.setenv("GPU_CHECK_SITE", str(planted))  # the override of old, now ignored
    seen = {}

    def run(check):  # the steps' environment, and one step, where every step imports from
        seen["site"], seen["mode"], seen["owner"] = check.site, check.site.stat().st_mode, check.site.stat().st_uid
        seen["fresh"], seen["path"] = not any(check.site.iterdir()), check.env["PYTHONPATH"]
        return check.step("python", [sys.executable, "-c", "import sitecustomize"])["returncode"]

    monkeypatch.setattr(gpu_check.Check, "run", run)
    gpu_check.main(["run", str(tmp_path / "out")])
    assert seen["site"].name.startswith("reasonrl-site-") and seen["site"] != planted and seen["fresh"]
    assert seen["mode"] & 0o777 == 0o700 and seen["owner"] == os.getuid()
    assert seen["path"].split(os.pathsep)[0] == str(seen["site"]) and str(planted) not in seen["path"]
    assert not marker.exists() and not seen["site"].exists()  # the planted code never ran; the folder is gone
