"""bench/train_side.py: the shapes are the published models', and the cpu profile's smoke measures every
implementation on the same rows."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.bench.smoke import ROOT

SPEC = importlib.util.spec_from_file_location("train_side", ROOT / "bench" / "train_side.py")
train_side = sys.modules["train_side"] = importlib.util.module_from_spec(SPEC)  # its dataclasses look it up
SPEC.loader.exec_module(train_side)


@pytest.mark.parametrize(
    ("shape", "billions"),
    [("smollm2-135m", 0.135), ("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.54), ("qwen2.5-7b", 7.62)],
)
def test_each_shape_has_the_published_models_parameter_count(shape, billions):
    with torch.device("meta"):  # no memory: only the count
        model = AutoModelForCausalLM.from_config(train_side.model_config(shape, smoke=False))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, rel=0.01)


def test_the_length_mix_is_long_tailed_within_the_cap_and_seeded():
    lengths = train_side.answer_lengths(4096, 200, seed=0)
    assert lengths == train_side.answer_lengths(4096, 200, seed=0) and max(lengths) <= 4096
    assert sorted(lengths)[100] < sum(lengths) / len(lengths)  # median below the mean: a long tail
    assert 0 < lengths.count(4096) < 40  # some answers truncated at the cap, most not


def test_the_cpu_smoke_measures_reasonrl_and_trl_on_the_same_rows(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "train_side.py"), "--profile", "cpu", "--smoke"]
    done = subprocess.run([*command, "--shapes", "smollm2-135m", "--out", str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_side_cpu_smoke.json", "train_side_cpu_smoke.png"]
    result = json.loads((tmp_path / "train_side_cpu_smoke.json").read_text())
    assert result == json.loads(done.stdout) and result["peak_bf16_flops"] is None
    measured = {c["implementation"]: c for c in result["configurations"]}
    skipped = {s["implementation"] for s in result["skipped"]}
    assert "reasonrl" in measured and set(measured) | skipped == {"reasonrl", "reasonrl_padded", "trl"}
    assert ("trl" in measured) == (importlib.util.find_spec("trl") is not None)
    assert len({c["real_tokens"] for c in measured.values()}) == 1  # the same rows for each
    for configuration in measured.values():
        for name in ("logprob", "update"):
            measures = configuration[name]
            assert measures["tokens_per_second"] > 0 and measures["tflops"] > 0 and measures["mfu"] is None
            assert 0 <= measures["pad_fraction"] < 1 and measures["microbatches"] >= 1
            assert 0 < measures["peak_memory_gb"] < 8
    packed = measured["reasonrl"]["update"]["pad_fraction"]  # lanes: only their tails are padding
    for other in set(measured) - {"reasonrl"}:  # padded: every row to its micro-batch's longest
        assert measured[other]["update"]["pad_fraction"] >= packed and measured[other]["update"]["pad_fraction"] > 0


def test_the_memory_plan_is_compared_with_every_fitted_reasonrl_configuration_measured_on_the_h100():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "memory_plan_gpu.py")], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    measured = json.loads((ROOT / "bench" / "results" / "train_side_gpu_h100.json").read_text())["configurations"]
    fitted = [c for c in measured if c["implementation"] != "trl" and c.get("fits")]
    assert len(result["points"]) + len(result["not_planned"]) == len(fitted) + 4  # + the trace's reasonrl cases
    for point in result["points"]:
        assert point["measured_over_predicted"] == pytest.approx(point["measured_gib"] / point["predicted_gib"], 0.01)


@pytest.mark.slow
def test_the_trace_smoke_times_each_case_three_times_and_writes_a_profile(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "train_side_trace.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "train_side_trace.json").read_text())
    assert not result["problems"] and len(result["cases"]) == 5
    for case in result["cases"]:
        assert len(case["update"]["seconds"]) == 3 and case["update"]["pad_fraction"] < 1
        assert (tmp_path / f"trace_{case['case']}.txt").read_text().count("\n") > 10
