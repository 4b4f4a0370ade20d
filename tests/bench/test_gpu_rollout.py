"""bench/gpu_rollout.py: every engine follows the same stop schedule, and the cpu profile's smoke measures
``generate`` and the paged engine's continuous batching on the same rows."""

import importlib.util
import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

from tests.bench.smoke import ROOT

sys.path.insert(0, str(ROOT / "bench"))
SPEC = importlib.util.spec_from_file_location("gpu_rollout", ROOT / "bench" / "gpu_rollout.py")
gpu_rollout = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_rollout)


def test_generate_and_continuous_batching_each_answer_at_its_scheduled_length():
    torch.manual_seed(0)
    config = gpu_rollout.model_config("qwen2.5-0.5b", smoke=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    prompts, lengths = gpu_rollout.prompts_and_lengths(6, 16, (4, 9), config.vocab_size, seed=1)
    assert (prompts, lengths) == gpu_rollout.prompts_and_lengths(6, 16, (4, 9), config.vocab_size, seed=1)
    assert len(set(lengths)) > 1 and max(lengths) <= 16  # a mix of lengths within the cap
    assert gpu_rollout.run_generate(model, prompts, lengths) == lengths
    assert gpu_rollout.run_paged(model, prompts, lengths) == lengths


def test_the_cpu_smoke_measures_both_engines_on_the_same_rows(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "gpu_rollout.py"), "--profile", "cpu", "--smoke", "--out"]
    done = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_rollout_cpu_smoke.json").read_text())
    assert result == json.loads(done.stdout) and result["device"] == "cpu" and result["bandwidth_tb_s"] is None
    by_batch = {}
    for row in result["rows"]:
        by_batch.setdefault(row["batch"], []).append(row)
        assert row["tokens_per_second"] > 0 and row["peak_memory_gb"] > 0 and row["fraction_of_bound"] is None
    assert sorted(by_batch) == [4, 8]
    for rows in by_batch.values():  # the same answers for each engine
        assert sorted(r["engine"] for r in rows) == ["generate", "paged"]
        assert len({r["answer_tokens"] for r in rows}) == 1
    assert [s["engine"] for s in result["skipped"]] == ([] if importlib.util.find_spec("vllm") else ["vllm"])
