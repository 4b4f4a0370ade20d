"""Liger's kernels (model.kernels, model.logprob_head): refused with their reason where they cannot run, the layer
kernels over the model's own parameters, and Liger's numbers equal to torch's.

Liger's kernels are Triton kernels.  On the CPU the equality tests run them in Triton's interpreter (a subprocess with
TRITON_INTERPRET=1: ``interpreted_checks``), where the fused linear cross-entropy (the head) and RoPE run; Liger's
RMSNorm and SwiGLU kernels do not run in Triton 3.9's interpreter (it passes float arguments as Python floats), so
their numbers are checked by the GPU test.  liger-kernel and Triton are in .venv-vllm: `make test-vllm` runs these
(marker ``liger``); `make test` runs the refusals.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reasonrl.config import ConfigError
from reasonrl.config.plan import layer_kernels_choice, liger_installed, logprob_head_choice
from reasonrl.models.load import ModelError
from reasonrl.training.update.policy import TokenLogprobs
from tests.models.test_packing import causal_lm, logprob_pass, long_tailed_batch

needs_liger = pytest.mark.skipif(not liger_installed(), reason="needs liger-kernel and Triton (.venv-vllm)")
REPO = Path(__file__).resolve().parents[2]


def test_auto_keeps_torchs_kernels_and_the_chunked_head_until_a_gpu_has_measured_liger():
    assert layer_kernels_choice("auto", "cpu") == "torch"
    assert layer_kernels_choice("auto", "cuda") == "torch"  # until a GPU check has run Liger's
    assert layer_kernels_choice("torch", "cuda") == "torch"
    assert logprob_head_choice("auto", "cuda", 0.0) == "chunked"


def test_liger_asked_for_where_it_cannot_run_is_refused_naming_what_is_missing():
    with pytest.raises(ConfigError, match=r"model.kernels=liger needs a CUDA device \(this run's: cpu\)"):
        layer_kernels_choice("liger", "cpu")
    with pytest.raises(
        ConfigError, match=r"model.logprob_head=liger needs .*no entropy bonus \(algo.entropy_coef=0.01"
    ):
        logprob_head_choice("liger", "cuda", 0.01)
    with pytest.raises(ConfigError, match=r"logprob_head=liger needs a CUDA device \(this run's: cpu\)"):
        logprob_head_choice("liger", "cpu", 0.0)


def test_liger_head_refuses_a_model_with_a_token_out_of_the_distribution():
    model = causal_lm("llama", "sdpa")
    model.config.image_token_id = 5  # a vision-language model's image placeholder, masked out of sampling
    with pytest.raises(ModelError, match="cannot take a vision-language model's image token out of the distribution"):
        TokenLogprobs(model, 1.0, torch.float32, logprob_head="liger")


@pytest.mark.liger
@needs_liger
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
def test_layer_kernels_replace_norms_and_mlps_over_the_same_parameters(family):
    from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP

    from reasonrl.models.liger_kernels import use_liger_layer_kernels

    model = causal_lm(family, "sdpa")
    before = dict(model.named_parameters())
    layers = model.config.num_hidden_layers
    norms = 2 * layers + 1 + (2 * layers if family == "qwen3" else 0)  # Qwen3 norms q and k too
    assert use_liger_layer_kernels(model) == norms + 2 * layers  # the MLPs, and the attention modules marked
    assert dict(model.named_parameters()) == before  # the same names and the same Parameter objects
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(LigerRMSNorm) == norms and kinds.count(LigerSwiGLUMLP) == layers
    norm = model.model.layers[0].input_layernorm
    assert norm.variance_epsilon == model.config.rms_norm_eps and norm.casting_mode == "llama"


@pytest.mark.liger
@needs_liger
def test_a_family_liger_does_not_cover_is_named():
    from reasonrl.models.liger_kernels import use_liger_layer_kernels

    with pytest.raises(ValueError, match=r"cover the llama, mistral, qwen2, qwen3 families .*'gemma'"):
        use_liger_layer_kernels(causal_lm("gemma", "eager"))


@pytest.mark.liger
@needs_liger
def test_rope_stays_torchs_on_a_cpu_outside_the_interpreter():
    from transformers.models.llama import modeling_llama

    from reasonrl.models.liger_kernels import use_liger_layer_kernels

    use_liger_layer_kernels(causal_lm("llama", "sdpa"))
    use_liger_layer_kernels(causal_lm("llama", "sdpa"))  # a second model does not wrap the RoPE twice
    assert modeling_llama.apply_rotary_pos_emb.torch_rope.__module__ == modeling_llama.__name__
    q, k = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8)
    cos, sin = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    for got, want in zip(
        modeling_llama.apply_rotary_pos_emb(q, k, cos, sin),
        modeling_llama.apply_rotary_pos_emb.torch_rope(q, k, cos, sin),
        strict=True,
    ):
        assert torch.equal(got, want)


def interpreted_checks() -> None:
    """Run under TRITON_INTERPRET=1 (``test_liger_kernels_in_tritons_interpreter_give_torchs_numbers``): Liger's
    head against the chunked head, fp32, 1e-5 (log-probs and the gradients of h, W and b, at two temperatures), and
    the RoPE that ``use_liger_layer_kernels`` routes to Liger against transformers' over a whole packed forward."""
    from reasonrl.models.checkpointing import enable_checkpointing
    from reasonrl.models.liger_kernels import fused_linear_logprobs, use_liger_layer_kernels
    from reasonrl.models.logprob_head import token_logprobs

    errors = {}
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 32, generator=generator, requires_grad=True)
    head = torch.nn.Linear(32, 96)
    targets = torch.randint(0, 96, (50,), generator=generator)
    upstream = torch.randn(50, generator=generator)
    for temperature in (1.0, 0.7):
        results = []
        for logprobs_of in (lambda t: token_logprobs(hidden, head, targets, t)[0],
                            lambda t: fused_linear_logprobs(hidden, head, targets, t)):  # fmt: skip
            hidden.grad = head.weight.grad = head.bias.grad = None
            logprobs = logprobs_of(temperature)
            (logprobs * upstream).sum().backward()
            results.append((logprobs.detach(), hidden.grad, head.weight.grad, head.bias.grad))
        for name, chunked, liger in zip(("logprobs", "hidden", "weight", "bias"), *results, strict=True):
            errors[f"head {name} T={temperature}"] = (chunked - liger).abs().max().item()
    head.weight.grad = None
    empty = fused_linear_logprobs(hidden[:0], head, targets[:0])  # no row: a zero gradient still reaches W
    empty.sum().backward()
    errors["head without rows"] = float(empty.shape != (0,)) + head.weight.grad.abs().max().item()
    # Liger's RoPE in a marked model, beside an unmarked one: its RMSNorm and SwiGLU do not run in this interpreter,
    # so the marked model gets torch's back; with selective checkpointing too (it keeps the projections' outputs,
    # which Liger's in-place rotation must not turn)
    from liger_kernel.transformers import rope

    batch = long_tailed_batch()
    expected = logprob_pass(causal_lm("llama", "sdpa"), batch, True)
    calls, dispatch = [], rope.dispatch
    rope.dispatch = lambda *args, **kwargs: calls.append(args[0]) or dispatch(*args, **kwargs)
    for checkpointing in ("none", "selective"):
        model, unmarked = causal_lm("llama", "sdpa"), causal_lm("llama", "sdpa")
        torch_modules = {n: m for n, m in model.named_modules() if n.endswith(("layernorm", "mlp", "norm"))}
        use_liger_layer_kernels(model)
        for name, module in torch_modules.items():
            model.set_submodule(name, module)
        if checkpointing == "selective":
            enable_checkpointing(model, "selective")
            model.train()
        calls.clear()
        got = logprob_pass(model, batch, True)
        passes = 2 if checkpointing == "selective" else 1  # the forward, and the recompute
        errors[f"rope calls per layer, {checkpointing}"] = len(calls) / model.config.num_hidden_layers - passes  # 0
        errors[f"rope logprobs, {checkpointing}"] = (got[0] - expected[0]).abs().max().item()
        errors[f"rope gradients, {checkpointing}"] = max(
            (got[2][k] - expected[2][k]).abs().max().item() for k in expected[2]
        )
        calls.clear()
        logprob_pass(unmarked, batch, True)
        errors[f"rope calls of an unmarked model, {checkpointing}"] = len(calls)
    rope.dispatch = dispatch
    print(json.dumps(errors))


@pytest.mark.liger
@needs_liger
def test_liger_kernels_in_tritons_interpreter_give_torchs_numbers():
    code = "from tests.models.test_liger_kernels import interpreted_checks; interpreted_checks()"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(errors) == 17
    assert all(error < 1e-5 for error in errors.values()), errors


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not liger_installed(), reason="needs a CUDA device and Liger")
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
@pytest.mark.parametrize("checkpointing", ["none", "selective"])
def test_liger_kernels_on_a_gpu_give_torchs_numbers(family, checkpointing):
    """Every Liger kernel reasonrl uses, on the GPU: layer kernels and Liger's head against torch's layers and the
    chunked head, fp32 (1e-4), and bf16 under autocast as the trainer runs (bf16 tolerances); with selective
    checkpointing too, which keeps the projections' outputs that Liger's RoPE must not rotate in place."""
    from reasonrl.models.checkpointing import enable_checkpointing
    from reasonrl.models.liger_kernels import use_liger_layer_kernels
    from reasonrl.training.update.policy import response_logprobs

    def run(model, head: str):
        model.zero_grad()
        logprobs, _ = response_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask, logprob_head=head
        )
        logprobs.sum().backward()
        return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    batch = long_tailed_batch()
    plain = causal_lm(family, "sdpa").cuda()
    liger = copy.deepcopy(plain)
    use_liger_layer_kernels(liger)
    if checkpointing == "selective":
        for model in (plain, liger):
            enable_checkpointing(model, "selective")
            model.train()
    for tolerance, autocast in ((1e-4, False), (5e-2, True)):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            expected, got = run(plain, "chunked"), run(liger, "liger")
        assert (expected[0] - got[0]).abs().max() < tolerance
        assert expected[1].keys() == got[1].keys()
        for name, grad in expected[1].items():
            assert torch.allclose(grad, got[1][name], atol=tolerance, rtol=tolerance), name
