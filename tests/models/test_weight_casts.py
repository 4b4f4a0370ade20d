"""A mini-batch's micro-batches reuse autocast's bf16 casts of the weights (models/forward.py: weight_casts_kept)."""

import contextlib

import torch
from torch.profiler import profile

from reasonrl.models.forward import autocast_context, weight_casts_kept
from reasonrl.models.load import load_model


def micro_batch_gradients(model, micro_batches, kept: bool):
    """Each weight's gradient summed over ``micro_batches`` under bf16 autocast, and the casts the passes made."""
    model.zero_grad(set_to_none=True)
    with profile() as trace, weight_casts_kept(model) if kept else contextlib.nullcontext():
        for ids in micro_batches:
            with autocast_context(torch.bfloat16, torch.device("cpu")):
                logits = model(input_ids=ids, use_cache=False).logits
            logits.float().square().mean().backward()
    casts = sum(event.count for event in trace.key_averages() if event.key == "aten::_to_copy")
    return casts, [p.grad.clone() for p in model.parameters()]


def test_a_minibatch_casts_each_weight_once_and_its_gradients_are_unchanged():
    torch.manual_seed(0)
    model = load_model("tiny-random", torch.float32)
    micro_batches = torch.randint(3, 200, (3, 2, 8))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    plain_casts, plain = micro_batch_gradients(model, micro_batches, kept=False)
    kept_casts, kept = micro_batch_gradients(model, micro_batches, kept=True)
    # the second and third micro-batches cast no linear weight again
    assert plain_casts - kept_casts == 2 * len(linears)
    assert all(torch.equal(a, b) for a, b in zip(plain, kept, strict=True))


def test_with_gradient_checkpointing_the_casts_are_not_kept():
    model = load_model("tiny-random", torch.float32)
    assert isinstance(weight_casts_kept(model), torch.autocast)
    model.gradient_checkpointing_enable()
    assert isinstance(weight_casts_kept(model), contextlib.nullcontext)
