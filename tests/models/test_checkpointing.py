"""Gradient checkpointing's policies (models/checkpointing.py): full and selective compute the gradients of no
checkpointing; selective computes no matmul twice (it keeps the matmuls' and attention's outputs), full computes
every layer's again."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.models.checkpointing import enable_checkpointing, keeps_output

MATMULS = ("mm", "addmm", "bmm")


class MatmulCounter(TorchDispatchMode):
    """Counts the matmuls dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func.__name__.split(".")[0] in MATMULS
        return func(*args, **(kwargs or {}))


def tiny_llama(attention: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=attention)  # fmt: skip
    return LlamaForCausalLM(config).train()


def gradients_and_backward_matmuls(model: LlamaForCausalLM) -> tuple[dict, int]:
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=ids, use_cache=False).logits
    counter = MatmulCounter()
    with counter:
        logits.float().logsumexp(-1).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}, counter.matmuls


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_selective_checkpointing_gives_the_same_gradients_and_computes_no_matmul_twice(attention):
    plain, plain_matmuls = gradients_and_backward_matmuls(tiny_llama(attention))
    counts = {}
    for policy in ("full", "selective"):
        model = tiny_llama(attention)
        enable_checkpointing(model, policy)
        grads, counts[policy] = gradients_and_backward_matmuls(model)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, plain[name], atol=1e-6, rtol=1e-5, msg=f"{policy}: {name}")
    assert counts["selective"] == plain_matmuls  # the backward's own matmuls, none recomputed
    # full recomputes each of the 3 layers' projections but the last (torch stops recomputing once it has what the
    # backward reads: the MLP's down projection is read by nothing), and eager's 2 attention matmuls
    assert counts["full"] == plain_matmuls + 3 * (6 + (2 if attention == "eager" else 0))


def test_selective_keeps_matmul_and_attention_outputs_and_recomputes_the_rest():
    aten = torch.ops.aten
    kept = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default)  # fmt: skip
    recomputed = (aten.mul.Tensor, aten.add.Tensor, aten._to_copy.default, aten.silu.default, aten.rsqrt.default,
                  aten.mean.dim, aten.pow.Tensor_Scalar, aten.cat.default, aten.neg.default)  # fmt: skip
    assert all(keeps_output(op) for op in kept) and not any(keeps_output(op) for op in recomputed)


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_a_run_checkpoints_its_layers_with_the_policy_it_asks_for(policy, tmp_path):
    from reasonrl.config import load_config
    from reasonrl.models.memory_plan import decoder_layers
    from reasonrl.training import setup

    overrides = ["model.device=cpu", "model.dtype=float32", "rollout.engine=hf", "model.name_or_path=tiny-random",
                 "model.gradient_checkpointing=true", f"model.checkpoint_policy={policy}"]  # fmt: skip
    run = setup.setup(load_config("dr_grpo", overrides), tmp_path)
    checkpoints = [layer._gradient_checkpointing_func.keywords for layer in decoder_layers(run.model)]
    assert checkpoints and all(("context_fn" in kept) == (policy == "selective") for kept in checkpoints)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_selective_keeps_less_than_none_and_more_than_full_with_the_same_gradients():
    """bf16 autocast on a GPU, as the trainer computes: the peak of forward + backward orders full < selective < none,
    and selective's gradients are none's."""
    peaks, grads = {}, {}
    for policy in ("none", "full", "selective"):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
        model = LlamaForCausalLM(config).cuda().train()
        if policy != "none":
            enable_checkpointing(model, policy)
        ids = torch.randint(0, 512, (4, 1024), generator=torch.Generator().manual_seed(1)).cuda()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        hidden.float().square().mean().backward()
        peaks[policy] = torch.cuda.max_memory_allocated()
        grads[policy] = {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    for name, grad in grads["selective"].items():
        torch.testing.assert_close(grad, grads["none"][name], atol=1e-3, rtol=1e-2, msg=name)
