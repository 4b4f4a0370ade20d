"""Memory options of the trainer: bf16 weights and gradients with fp32 AdamW moments
(train.param_dtype), AdamW's moments in CPU memory (train.offload_optimizer), and checkpoints of both."""

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import ConfigError, resolve
from reasonrl.models.load import load_model
from reasonrl.models.optim import DITHER_SEED, MasterWeightAdamW, apply_gradients, dithered_master
from reasonrl.training.backend import SingleProcess
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.setup import build_policy_updater
from reasonrl.training.update.policy import TokenLogprobs
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
    plan = dataclasses.replace(resolve(cfg), microbatch_tokens=512)
    model = load_model("tiny-random", plan.parameter_torch_dtype, device=device)
    policy = TokenLogprobs(model, temperature=1.0, compute_dtype=plan.forward_torch_dtype)
    gradient_dtypes = set()
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(lambda p: gradient_dtypes.add(p.grad.dtype))
    updater = build_policy_updater(cfg, plan, policy, SingleProcess())
    for step in range(steps):
        updater.update(rollout_batch(seed=step), seed=step)
    return dict(model.named_parameters()), gradient_dtypes, updater.optimizer


def test_bf16_parameters_store_weights_and_gradients_in_bf16_and_an_fp32_master_and_moments():
    start = {name: p.detach().clone() for name, p in load_model("tiny-random", torch.bfloat16).named_parameters()}
    weights, gradient_dtypes, optimizer = updated_policy(*BF16)
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert gradient_dtypes == {torch.bfloat16}
    kept = [state[key] for state in optimizer.state.values() for key in ("master", "exp_avg", "exp_avg_sq")]
    assert len(kept) == 3 * len(weights) and {m.dtype for m in kept} == {torch.float32}
    # every master moved (the norms' weights of 1.0 too, whose first updates are under bf16's spacing there), and
    # every weight is its master rounded to bf16
    for parameter in optimizer.param_groups[0]["params"]:
        master = optimizer.state[parameter]["master"]
        assert torch.equal(parameter.detach(), master.to(torch.bfloat16))
    masters = {name: optimizer.state[weights[name]]["master"] for name in weights}
    assert not [name for name in start if torch.equal(masters[name], start[name].float())]


def trained_weights(optimizer, weights) -> dict[str, torch.Tensor]:
    """What a run has learnt: each weight's fp32 master where the optimiser keeps one, else the weight."""
    return {name: optimizer.state[w].get("master", w).detach().float() for name, w in weights.items()}


def first_masters(optimizer, start: dict[str, torch.Tensor], weights) -> dict[str, torch.Tensor]:
    """The masters ``optimizer`` made from the bf16 ``start`` weights at its first step: ``dithered_master``'s, drawn
    from one ``DITHER_SEED`` generator in its weights' order (fp32 weights: themselves)."""
    names = {id(w): name for name, w in weights.items()}
    generator = torch.Generator().manual_seed(DITHER_SEED)
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {name: dithered_master(start[name], torch.device("cpu"), generator) for name in order}


def test_a_bf16_weights_master_lies_anywhere_in_its_rounding_cell_and_small_steps_move_it_on_average():
    """``dithered_master``: each master rounds back to its bf16 weight exactly and lies uniformly in the weight's
    rounding cell, so a step of a fiftieth of a cell moves 2% of the bf16 copies by a whole cell (the step, on
    average), where masters equal to their weights round every such step away."""
    generator = torch.Generator().manual_seed(0)
    weights = (torch.randn(200_000, generator=generator) * 0.05).bfloat16()
    masters = dithered_master(weights, torch.device("cpu"), torch.Generator().manual_seed(DITHER_SEED))
    assert masters.dtype == torch.float32 and torch.equal(masters.bfloat16(), weights)
    offset = masters - weights.float()
    up = torch.nextafter(weights, torch.full_like(weights, 1.0e9)).float() - weights.float()
    down = weights.float() - torch.nextafter(weights, torch.full_like(weights, -1.0e9)).float()
    share = offset / torch.where(offset >= 0, up, down)  # where in its cell each master lies: (−½, ½)
    assert share.abs().max() < 0.5 and abs(share.mean()) < 0.01 and (share.abs() > 0.4).float().mean() > 0.15
    step = up / 50
    moved = (masters + step).bfloat16().float() - weights.float()
    assert abs((moved / step).mean() - 1) < 0.05
    assert torch.equal((weights.float() + step).bfloat16(), weights)  # undithered: every step rounded away
    fp32 = torch.randn(10, generator=generator)
    assert torch.equal(dithered_master(fp32, torch.device("cpu"), generator), fp32)


@pytest.mark.parametrize(
    ("options", "within"),
    [(OFFLOAD, 1e-5), (BF16, 0.1), ((*BF16, *OFFLOAD), 0.1)],
    ids=["offload", "bf16", "bf16-offload"],
)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA device")]),
    ],
)  # fmt: skip
def test_updates_at_rl_learning_rates_are_learnt_as_the_fp32_run_learns_them(options, within, device):
    """At lr 1e-6 on weights of about 0.02 (half a bf16 spacing: 6e-5) a bf16 weight without a master keeps about
    1% of the fp32 run's movement (its updates round away: 99% off, measured); with an fp32 master every memory
    configuration learns what the fp32 run learns: to float noise with offloading, and to the 4-8% that bf16
    forward passes change the gradients by (two steps: 5.5%)."""

    def moves(*overrides):
        cfg = tiny_config(*overrides)
        initial = load_model("tiny-random", getattr(torch, cfg.train.param_dtype))
        start = {n: p.detach() for n, p in initial.named_parameters()}
        weights, _, optimizer = updated_policy(*overrides, device=device)
        masters = first_masters(optimizer, start, weights)  # the bf16 weights' dithered starting masters
        learnt = {n: w.cpu() - masters[n] for n, w in trained_weights(optimizer, weights).items()}
        stored = {n: w.detach().float().cpu() - start[n].float() for n, w in weights.items()}
        return learnt, stored

    def relative_error(moved, expected):
        error = sum((moved[n] - expected[n]).norm() ** 2 for n in expected) ** 0.5
        return (error / sum(expected[n].norm() ** 2 for n in expected) ** 0.5).item()

    expected, _ = moves("model.dtype=bfloat16", "train.lr=1e-6")
    learnt, stored = moves("model.dtype=bfloat16", "train.lr=1e-6", *options)
    assert relative_error(learnt, expected) < within
    if BF16[0] in options:  # the bf16 weights the forward passes use: a few elements move a whole bf16 spacing, and
        # together they move as far along the fp32 run's update as it does (their masters are dithered), far from it
        # element by element (a weight without a master, or a master equal to its weight, kept ~1% of it)
        along = sum((stored[n] * expected[n]).sum() for n in expected) / sum(expected[n].norm() ** 2 for n in expected)
        assert 0.5 < along < 1.5 and relative_error(stored, expected) > 0.9


def test_bf16_parameters_run_the_forward_passes_in_bf16_and_refuse_float32_ones():
    assert resolve(tiny_config(*BF16), "cpu").forward_dtype == "bfloat16"  # even where model.dtype=auto would pick fp32
    with pytest.raises(ConfigError, match=r"train.param_dtype=bfloat16 .* set model.dtype=bfloat16 \(or auto\)"):
        tiny_config(*BF16, "model.dtype=float32")


def test_offloading_the_optimiser_gives_the_same_weights_with_its_moments_in_cpu_memory():
    plain, _, _ = updated_policy("model.dtype=float32")
    offloaded, _, optimizer = updated_policy("model.dtype=float32", *OFFLOAD)
    assert isinstance(optimizer, MasterWeightAdamW)
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
    assert {w.dtype for w in a.values()} == {getattr(torch, tiny_config(*second_half).train.param_dtype)}
    moments = torch.load(checkpoints[0] / "trainer.pt", weights_only=True)["optimizer"]["state"]
    assert {m.dtype for state in moments.values() for m in (state["exp_avg"], state["exp_avg_sq"])} == {torch.float32}
    if BF16[0] in second_half:  # the fp32 masters are saved: a resumed run continues what was learnt, not its bf16 copy
        assert {state["master"].dtype for state in moments.values()} == {torch.float32}
    straight, split = (comparable(read_metrics(tmp_path / run / "metrics.jsonl")) for run in ("straight", "split"))
    assert straight == split


def test_bf16_weights_sum_their_micro_batches_gradients_in_fp32_and_clip_that_sum():
    """Eight micro-batches' bf16 gradients of one bf16 weight: the optimiser holds their sum in fp32 (to the bit the
    sum of the same bf16 gradients in fp32, as FSDP2 sums them), where adding them into the bf16 ``.grad`` would
    round the sum to 8 significant bits; clipping scales that sum, and the step moves the master by it."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16)
    optimizer = MasterWeightAdamW(list(layer.parameters()), lr=1e-3, weight_decay=0.0)
    inputs = [torch.randn(4, 64, dtype=torch.bfloat16) * scale for scale in (1, 30, 0.01, 5, 1, 100, 0.3, 2)]
    one_by_one = [torch.autograd.grad(layer(x).square().sum(), layer.weight)[0] for x in inputs]
    in_fp32 = torch.zeros(64, 64)
    in_bf16 = torch.zeros(64, 64, dtype=torch.bfloat16)
    for grad in one_by_one:
        in_fp32 += grad
        in_bf16 += grad
    for x in inputs:
        layer(x).square().sum().backward()
    assert layer.weight.grad is None  # moved into the fp32 sum as each backward left it
    (held,) = optimizer.gradients()
    assert held.dtype == torch.float32 and torch.equal(held, in_fp32)
    assert not torch.equal(in_bf16.float(), in_fp32)  # what a bf16 sum would have held instead
    # the step torch's AdamW takes on an fp32 copy of the weight (from its dithered master), given the fp32 sum
    # clipped by torch
    reference = torch.nn.Parameter(
        dithered_master(layer.weight, torch.device("cpu"), torch.Generator().manual_seed(DITHER_SEED))
    )
    reference.grad = in_fp32.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_([reference], 1.0).item()
    torch.optim.AdamW([reference], lr=1e-3, weight_decay=0.0, fused=True).step()
    norm = apply_gradients(layer, optimizer, grad_clip=1.0)
    assert norm == pytest.approx(expected_norm, rel=1e-6)
    torch.testing.assert_close(optimizer.state[layer.weight]["master"], reference.detach(), atol=1e-7, rtol=0)
    assert optimizer.gradients() == [] and layer.weight.grad is None


@pytest.mark.parametrize(("world_size", "head_dtype"), [(1, torch.float32), (2, torch.bfloat16)])
def test_a_bf16_critics_value_head_stays_fp32_on_one_process_and_takes_the_backbones_dtype_under_fsdp2(
    world_size, head_dtype
):
    from reasonrl.config import load_config
    from reasonrl.training.setup import build_critic

    cfg = load_config("ppo", ["model.name_or_path=tiny-random", *BF16])
    critic = build_critic(cfg, resolve(cfg, "cpu", world_size), torch.device("cpu"))
    assert critic.model.head.weight.dtype == head_dtype  # FSDP2 shards the root unit (with the head) in one dtype
    assert {p.dtype for p in critic.model.backbone.parameters()} == {torch.bfloat16}
