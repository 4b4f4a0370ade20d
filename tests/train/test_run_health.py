"""Runs that stop instead of training on nothing, on NaN or on weights other than their own; and the KL to
an identical reference, which is exactly zero (reasonrl/training/record/run_health.py, docs/metrics.md "Runs that
stop")."""

import logging

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.models.load import load_model
from reasonrl.models.optim import MasterWeightAdamW, NonFiniteWeightsError
from reasonrl.rollout.fast import FastEngine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.run_health import RunHealth, RunHealthError
from tests.helpers import Constant, DigitFraction
from tests.train.test_loop import tiny_config


def test_an_engine_that_misses_a_weight_update_stops_the_run_naming_it(tmp_path, monkeypatch):
    """The engine keeps its first weights (as an engine woken from sleep, or a LoRA adapter, that did not reload):
    the step after the first update stops, naming the engine, before training on the old policy's samples."""
    monkeypatch.setattr(FastEngine, "load_weights", lambda self, state_dict: None)
    cfg = tiny_config("train.rollout_steps=4", "train.lr=1e-2", "train.minibatch_sequences=4", "rollout.engine=fast")
    with pytest.raises(RunHealthError, match=r"^the rollout engine \(fast\) does not serve the trainer's weights: "):
        fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1]  # step 2 stopped before its update
    monkeypatch.undo()  # the same run with an engine that takes its updates trains on
    fit(cfg, tmp_path / "synced", verifier=DigitFraction(), show_progress=False)


def test_the_engine_check_warns_once_on_a_growing_gap_and_stops_at_ten_times_the_first(caplog):
    health = RunHealth("vllm", 0)
    health.check_engine(1, 0.02)  # the run's own baseline
    with caplog.at_level(logging.WARNING):
        health.check_engine(2, 0.15)
        health.check_engine(3, 0.18)
    assert caplog.text.count("rollout/logprob_abs_diff is 0.15 per token at step 2, above 0.1") == 1
    assert "another precision, attention kernel or chat template" in caplog.text
    with pytest.raises(RunHealthError, match=r"at step 4 its log-probs differ .* by 0\.25 per token, 12× the first"):
        health.check_engine(4, 0.25)
    fp32 = RunHealth("hf", 0)  # an engine that agrees to float rounding: the absolute floor decides
    fp32.check_engine(1, 1e-6)
    fp32.check_engine(2, 0.04)
    with pytest.raises(RunHealthError):
        fp32.check_engine(3, 0.06)
    fp32.check_engine(4, None)  # nothing measured (no tokens of the newest weights): nothing checked


def test_a_batch_without_signal_takes_no_update_and_constant_rewards_stop_the_run(tmp_path):
    """Every reward 0: every advantage 0, so no step moves the weights (grpo's KL term included: at identical
    weights its gradient is exactly zero anyway); after train.constant_reward_stop_steps such steps the run stops
    with the reason, and 0 trains on."""
    cfg = tiny_config("train.rollout_steps=3", "run.save_every=1", "algo.kl_placement=loss", "algo.kl_coef=0.1")
    with pytest.raises(RunHealthError, match=r"every response got the same reward \(0\) for 3 steps in a row"):
        fit(
            tiny_config("train.constant_reward_stop_steps=3", *cfg_overrides(cfg)),
            tmp_path / "stops",
            verifier=Constant(),
            show_progress=False,
        )
    fit(
        tiny_config("train.constant_reward_stop_steps=0", *cfg_overrides(cfg)),
        tmp_path / "on",
        verifier=Constant(),
        show_progress=False,
    )
    records = [r for r in read_metrics(tmp_path / "on" / "metrics.jsonl") if r["step"] > 0]
    assert [r["train/no_signal_step"] for r in records] == [1.0, 1.0, 1.0]
    initial = load_model("tiny-random").state_dict()
    trained = load_file(tmp_path / "on" / "checkpoints" / "step-000003" / "model.safetensors")
    assert all(torch.equal(trained[k], initial[k].to(trained[k].dtype)) for k in trained)  # bf16: the same, rounded


def cfg_overrides(_cfg):
    return ["train.rollout_steps=3", "run.save_every=1", "algo.kl_placement=loss", "algo.kl_coef=0.1"]


def test_the_kl_to_an_identical_reference_is_exactly_zero(tmp_path):
    """Policy and reference hold the same weights (a learning rate too small to move a float32 weight keeps them
    so through the step's two mini-batches): the reference's log-probs, computed over the update's own
    micro-batches in the policy's precision, equal the update's to the bit, so the KL term (and its gradient) is
    exactly 0 in every mini-batch, in bf16 autocast as in fp32."""
    for dtype in ("auto", "float32"):
        cfg = tiny_config(
            "train.rollout_steps=1",
            "train.lr=1e-30",
            "algo.kl_placement=loss",
            "algo.kl_coef=0.1",
            "train.minibatch_sequences=8",
            "rollout.max_prompt_tokens=100",
            "train.microbatch_tokens=128",  # several micro-batches per mini-batch, packed
            f"model.dtype={dtype}",
        )
        fit(cfg, tmp_path / dtype, verifier=DigitFraction(), show_progress=False)
        (step,) = [r for r in read_metrics(tmp_path / dtype / "metrics.jsonl") if r["step"] == 1]
        assert step["perf/microbatches_reference"] > 2
        assert step["policy/kl_ref"] == 0.0 and step["loss/kl"] == 0.0, (dtype, step["loss/kl"])


@pytest.mark.parametrize(
    ("optimizer", "stored"), [(torch.optim.AdamW, "float32"), (MasterWeightAdamW, "bfloat16")], ids=["fp32", "bf16"]
)
def test_an_update_that_leaves_nan_weights_stops_before_saving_them(tmp_path, monkeypatch, optimizer, stored):
    """An optimiser step that writes NaN into a weight (an overflow in its arithmetic) stops the run at that
    update: no checkpoint, weight sync or exported model takes the weights."""
    step = optimizer.step

    def overflows(self, *args, **kwargs):
        step(self, *args, **kwargs)
        self.param_groups[0]["params"][0].data[0] = float("nan")

    monkeypatch.setattr(optimizer, "step", overflows)
    cfg = tiny_config("train.rollout_steps=2", "run.save_every=1", f"train.param_dtype={stored}")
    with pytest.raises(NonFiniteWeightsError, match=r"^the policy's weights hold NaN or infinity after its update"):
        fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "final").exists()


def test_a_loss_that_stays_nan_stops_the_run(tmp_path):
    """A learning rate that pushes finite weights past what the forward pass computes (1e30: every log-prob NaN
    from its second optimiser step) makes every later gradient NaN; each such step is skipped, three in a row stop."""
    cfg = tiny_config("train.rollout_steps=6", "train.lr=1e30", "train.constant_reward_stop_steps=0")
    with pytest.raises(RunHealthError, match=r"^the policy.s gradient was NaN or infinite in steps 1-3 "):
        fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
