"""Memory options of the trainer: bf16 weights and gradients with fp32 AdamW moments
(train.param_dtype), AdamW's moments in CPU memory (train.offload_optimizer), and checkpoints of both."""

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import ConfigError, resolve
from reasonrl.models.load import load_model
from reasonrl.models.optim import Fp32StateAdamW
from reasonrl.train.backend import SingleProcess
from reasonrl.train.loop import fit
from reasonrl.train.metrics import read_metrics
from reasonrl.train.policy import TokenLogprobs
from reasonrl.train.setup import build_policy_updater, forward_dtype, parameter_dtype
from tests.helpers import DigitFraction
from tests.train.test_loop import comparable, tiny_config
from tests.train.test_step import rollout_batch

BF16 = ("train.param_dtype=bfloat16",)  # model.dtype stays auto: bf16 forward passes on any hardware
OFFLOAD = ("train.offload_optimizer=true",)


def updated_policy(*overrides, device="cpu", steps=2):
    """A tiny-random policy after ``steps`` updates of a fixed batch, built as setup builds it from the
    config; the gradients' dtypes seen in its backward passes; and its optimiser."""
    cfg = tiny_config("train.lr=1e-3", f"model.device={device}", *overrides)
    torch.manual_seed(0)
    model = load_model("tiny-random", parameter_dtype(cfg), device=device)
    policy = TokenLogprobs(model, temperature=1.0, compute_dtype=forward_dtype(cfg))
    gradient_dtypes = set()
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(lambda p: gradient_dtypes.add(p.grad.dtype))
    updater = build_policy_updater(cfg, resolve(cfg), policy, 512, SingleProcess())
    for step in range(steps):
        updater.update(rollout_batch(seed=step), seed=step)
    return dict(model.named_parameters()), gradient_dtypes, updater.optimizer


def test_bf16_parameters_store_weights_and_gradients_in_bf16_and_adamw_moments_in_fp32():
    start = {name: p.detach().clone() for name, p in load_model("tiny-random", torch.bfloat16).named_parameters()}
    weights, gradient_dtypes, optimizer = updated_policy(*BF16)
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert gradient_dtypes == {torch.bfloat16}
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(weights) and {m.dtype for m in moments} == {torch.float32}
    # the precision trade: the norms' weights of 1.0 keep their value, as AdamW's first steps move a weight by
    # about lr = 1e-3, under half of bf16's spacing of 2^-7 at 1.0; the small weights (about 0.02) all move
    unchanged = {name for name in start if torch.equal(weights[name].detach(), start[name])}
    assert unchanged == {name for name in start if name.endswith("norm.weight")}


def test_bf16_parameters_run_the_forward_passes_in_bf16_and_refuse_float32_ones():
    assert forward_dtype(tiny_config(*BF16)) == torch.bfloat16  # even where model.dtype=auto would pick fp32
    with pytest.raises(ConfigError, match=r"train.param_dtype=bfloat16 .* set model.dtype=bfloat16 \(or auto\)"):
        tiny_config(*BF16, "model.dtype=float32")


def test_offloading_the_optimiser_gives_the_same_weights_with_its_moments_in_cpu_memory():
    plain, _, _ = updated_policy("model.dtype=float32")
    offloaded, _, optimizer = updated_policy("model.dtype=float32", *OFFLOAD)
    assert isinstance(optimizer, Fp32StateAdamW)
    assert {m.device.type for state in optimizer.state.values() for m in state.values()} == {"cpu"}
    for name, weight in plain.items():
        torch.testing.assert_close(offloaded[name], weight, atol=1e-6, rtol=0, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offloading_on_a_gpu_keeps_the_moments_off_it_and_the_update_the_same():
    plain, _, _ = updated_policy("model.dtype=float32", device="cuda")
    offloaded, _, optimizer = updated_policy("model.dtype=float32", *OFFLOAD, device="cuda")
    assert {m.device.type for state in optimizer.state.values() for m in state.values()} == {"cpu"}
    assert {w.device.type for w in offloaded.values()} == {"cuda"}
    for name, weight in plain.items():
        torch.testing.assert_close(offloaded[name], weight, atol=1e-5, rtol=0, msg=name)  # CPU vs CUDA kernels


@pytest.mark.parametrize(
    ("first_half", "second_half"),
    [(BF16, BF16), ((), OFFLOAD)],  # a resumed run may switch offloading on: it changes no update
    ids=["bf16", "offload"],
)
def test_a_run_with_each_memory_option_resumes_exactly(tmp_path, first_half, second_half):
    def train(directory, steps, options):
        cfg = tiny_config(f"train.rollout_steps={steps}", "run.save_every=1", "train.lr=1e-3", *options)
        fit(cfg, directory, verifier=DigitFraction(), show_progress=False)

    train(tmp_path / "straight", 2, second_half)
    train(tmp_path / "split", 1, first_half)
    train(tmp_path / "split", 2, second_half)
    checkpoints = [tmp_path / run / "checkpoints" / "step-000002" for run in ("straight", "split")]
    a, b = (load_file(c / "model.safetensors") for c in checkpoints)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {w.dtype for w in a.values()} == {parameter_dtype(tiny_config(*second_half))}
    moments = torch.load(checkpoints[0] / "trainer.pt", weights_only=True)["optimizer"]["state"]
    assert {m.dtype for state in moments.values() for m in (state["exp_avg"], state["exp_avg_sq"])} == {torch.float32}
    straight, split = (comparable(read_metrics(tmp_path / run / "metrics.jsonl")) for run in ("straight", "split"))
    assert straight == split
