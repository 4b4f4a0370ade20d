"""Training with the policy on CUDA (marked gpu: `make test-gpu`; skipped cleanly without a CUDA device).

The engine is ``auto``: vLLM where it is installed (colocated, sleep mode), else transformers' generate
on the GPU; the fast engine is CPU-only and refuses a CUDA model."""

import math

import pytest
import torch

from reasonrl.config import load_config
from reasonrl.models.load import ModelError, load_model
from reasonrl.rollout import build_engine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.helpers import ResponseLength
from tests.train.test_loop import TINY
from tests.train.test_step import rollout_batch, updated_parameters

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize(
    ("preset", "attention"), [("grpo", "auto"), ("vapo", "auto"), ("t_ppo", "auto"), ("vapo", "varlen")]
)
def test_three_steps_train_on_cuda(tmp_path, preset, attention):
    overrides = [
        *TINY,
        "model.device=cuda",
        "train.rollout_steps=3",
        "run.eval_every=100",
        f"model.attention={attention}",
    ]
    if preset != "grpo":
        overrides.append("algo.value_pretrain_steps=1")
    if preset == "t_ppo":
        overrides.append("algo.window_tokens=4")  # windows shorter than the 12-token responses
    fit(load_config(preset, overrides), tmp_path, verifier=ResponseLength(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert len(records) == 3
    assert all(0 < r["perf/peak_gpu_memory_gb"] < 80 for r in records)
    assert all(math.isfinite(r["loss/policy"]) for r in records)


def test_ppo_ratio_is_exactly_one_at_the_first_minibatch_on_cuda():
    from reasonrl.training.update.policy import response_logprobs

    batch = rollout_batch(3)
    model = load_model("tiny-random", device="cuda")
    with torch.no_grad():
        old, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    batch.old_logprobs = old.cpu()
    _, metrics, _ = updated_parameters(10_000, "token-mean", batch, lr=0.1, device="cuda")
    assert metrics["policy/ratio_mean"] == 1.0 and metrics["policy/clip_frac_high"] == 0.0


def test_the_fast_engine_refuses_a_cuda_model():
    model = load_model("tiny-random", device="cuda")
    with pytest.raises(ModelError, match="the fast engine generates on the CPU"):
        build_engine("fast", model, None)


def test_eval_generates_on_the_gpu_by_default(monkeypatch, capsys):
    import reasonrl.jobs.evaluate
    from reasonrl.cli import main

    devices = []
    build = reasonrl.jobs.evaluate.build_engine

    def recording_build(name, model, *args, **kwargs):
        devices.append(next(model.parameters()).device.type)
        return build(name, model, *args, **kwargs)

    monkeypatch.setattr(reasonrl.jobs.evaluate, "build_engine", recording_build)
    assert main(["eval", "--model", "tiny-random", "--limit", "2", "--max-new-tokens", "4"]) == 0
    assert devices == ["cuda"]


def test_grpo_on_a_visual_task_trains_the_vlm_on_cuda(tmp_path):
    from tests.train.test_vlm_training import VLM_RUN

    fit(load_config("grpo", [*VLM_RUN, "model.device=cuda", "train.rollout_steps=2", "run.eval_every=100"]),
        tmp_path, verifier=ResponseLength(), show_progress=False)  # fmt: skip
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert len(records) == 2
    assert all(0 < r["perf/peak_gpu_memory_gb"] < 80 for r in records)
    assert all(math.isfinite(r["loss/policy"]) for r in records)


def test_an_asynchronous_run_trains_on_cuda_with_its_producer_beside_it(tmp_path):
    """rollout.max_staleness=1 with the policy on CUDA: the producer (a spawned process) builds its own CUDA
    engine, on a spare GPU where the machine has one, and takes the weights the trainer publishes."""
    overrides = [*TINY, "model.device=cuda", "train.rollout_steps=3", "run.eval_every=100", "rollout.max_staleness=1"]
    fit(load_config("grpo", overrides), tmp_path, verifier=ResponseLength(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(0 <= r["rollout/staleness_max"] <= 1 and math.isfinite(r["loss/policy"]) for r in records)
