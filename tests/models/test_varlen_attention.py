"""model.attention=varlen: one packed sequence through torch's variable-length flash attention, registered with
transformers, gives the padded batch's numbers, builds no mask, and stays SDPA everywhere else.

torch's kernel runs on CUDA only: on the CPU ``varlen_kernel`` is replaced by ``segment_attention`` below (SDPA
over each segment alone), so these tests check everything around the kernel (the segments' bounds, the layout,
grouped-query heads, the scale, no mask built, SDPA for padded calls and ``generate``); the GPU test at the end
runs torch's kernel itself.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from reasonrl.config import ConfigError
from reasonrl.config.plan import attention_implementation
from reasonrl.models import varlen_attention
from reasonrl.models.forward import PACKING_VERIFIED
from reasonrl.models.varlen_attention import VARLEN_ATTENTION, VARLEN_VERIFIED, transformers_attention, varlen_refusal
from tests.models.test_packing import TEXT_FAMILIES, family_config, logprob_pass, long_tailed_batch

# the packing tests' configs that carry a sliding window or soft-capping
WINDOWED = sorted(f for f in TEXT_FAMILIES if f in VARLEN_VERIFIED and varlen_refusal(family_config(f)))


def plain_config(family: str):
    """The packing tests' config of ``family`` with every layer full causal attention, unsoftcapped."""
    config = family_config(family)
    if getattr(config, "layer_types", None):  # the window stays a setting, used by no layer
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    else:
        for key, off in (("sliding_window", None), ("use_sliding_window", False)):
            if hasattr(config, key):
                setattr(config, key, off)
    if hasattr(config, "attn_logit_softcapping"):
        config.attn_logit_softcapping = None
    return config


def segment_attention(query, key, value, boundaries, longest, scale):
    """What torch's varlen_attn computes, from SDPA: causal attention within each segment [N, H, D]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.empty_like(query)
    bounds = boundaries.tolist()
    assert max(b - a for a, b in itertools.pairwise(bounds)) == longest
    for start, end in itertools.pairwise(bounds):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # [H, n, D]
        out[start:end] = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(0, 1)
    return out


@pytest.fixture
def kernel_calls(monkeypatch):
    """The CPU stand-in for the kernel, recording the segments' bounds of each call."""
    calls = []

    def recorded(query, key, value, boundaries, longest, scale):
        calls.append(boundaries.tolist())
        return segment_attention(query, key, value, boundaries, longest, scale)

    monkeypatch.setattr(varlen_attention, "varlen_kernel", recorded)
    return calls


@pytest.fixture
def masks_built(monkeypatch):
    """Every mask the varlen mask function returned (None where it built none)."""
    from transformers import AttentionMaskInterface

    transformers_attention("varlen", family_config("llama"))
    registered = AttentionMaskInterface._global_mapping[VARLEN_ATTENTION]
    built = []

    def spy(*args, **kwargs):
        built.append(registered(*args, **kwargs))
        return built[-1]

    monkeypatch.setitem(AttentionMaskInterface._global_mapping, VARLEN_ATTENTION, spy)
    return built


def varlen_lm(family: str):
    from transformers import AutoModelForCausalLM

    from reasonrl.models.load import without_dropout

    torch.manual_seed(0)
    config = plain_config(family)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=transformers_attention("varlen", config))
    return without_dropout(model.float())


@pytest.mark.parametrize("family", sorted(VARLEN_VERIFIED))
def test_one_packed_sequence_gives_the_padded_batchs_numbers_without_a_mask(family, kernel_calls, masks_built):
    model, batch = varlen_lm(family), long_tailed_batch()
    assert model.config._attn_implementation == VARLEN_ATTENTION
    packed = logprob_pass(model, batch, True)
    layers = len(kernel_calls)
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    assert layers == model.config.num_hidden_layers  # every layer got the segments' bounds: one sequence of rows
    bounds = kernel_calls[0]  # each row one segment, in the order the sequence holds them
    assert bounds[0] == 0 and sorted(b - a for a, b in itertools.pairwise(bounds)) == sorted(lengths)
    assert all(mask is None for mask in masks_built)  # no [N, N] mask, ever
    masks_built.clear()
    padded = logprob_pass(model, batch, False)  # a padded batch: SDPA with its mask, no kernel call
    assert len(kernel_calls) == layers and any(mask is not None for mask in masks_built)
    assert torch.allclose(packed[0], padded[0], atol=1e-5) and torch.allclose(packed[1], padded[1], atol=1e-5)
    assert packed[2].keys() == padded[2].keys() and len(packed[2]) > 0
    for name, grad in packed[2].items():
        assert torch.allclose(grad, padded[2][name], atol=1e-5), name


def test_recomputed_layers_get_the_segments_bounds_too(kernel_calls, masks_built):
    """Under gradient checkpointing the backward recomputes each layer with the same bounds (no mask is built)."""
    plain, batch = varlen_lm("qwen2"), long_tailed_batch()
    expected = logprob_pass(plain, batch, False)
    model = varlen_lm("qwen2")
    model.gradient_checkpointing_enable()
    model.train()
    kernel_calls.clear()
    packed = logprob_pass(model, batch, True)
    assert len(kernel_calls) == 2 * model.config.num_hidden_layers  # forward, then each layer again in backward
    assert all(calls == kernel_calls[0] for calls in kernel_calls)
    assert torch.allclose(packed[0], expected[0], atol=1e-5)
    for name, grad in packed[2].items():
        assert torch.allclose(grad, expected[2][name], atol=1e-5), name


def test_generate_with_the_varlen_model_is_sdpas_generate(kernel_calls):
    """The hf engine copies the trainer's model: left padding and the KV cache go through SDPA's mask."""
    model = varlen_lm("qwen2")
    reference = varlen_lm("qwen2")
    reference.config._attn_implementation = "sdpa"
    prompts = torch.tensor([[0, 0, 5, 7, 9], [3, 4, 5, 6, 7]])
    mask = (prompts != 0).long()
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompts, **options), reference.generate(prompts, **options))
    assert not kernel_calls


@pytest.mark.parametrize("engine", ["hf", "paged"])
def test_the_engines_copy_of_a_varlen_policy_generates_with_sdpa(engine, kernel_calls):
    from reasonrl.models.tiny import tiny_tokenizer
    from reasonrl.rollout import build_engine
    from reasonrl.rollout.engine_protocol import SamplingParams

    model = varlen_lm("llama")
    served = build_engine(engine, model, tiny_tokenizer())
    assert served.model.config._attn_implementation == "sdpa" and model.config._attn_implementation == VARLEN_ATTENTION
    out = served.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=3, seed=0, ignore_stop=True))
    assert [len(o.token_ids) for o in out] == [3, 3] and not kernel_calls


def test_varlen_is_refused_where_it_cannot_run_naming_what_is_missing():
    with pytest.raises(ConfigError, match=r"a CUDA device \(this run's: cpu\)"):
        attention_implementation("varlen", "cpu", 128)
    with pytest.raises(ConfigError, match=r"train.pack_sequences=true.*bf16 forwards \(this run's: float32\)"):
        attention_implementation("varlen", "cuda", 128, packed=False, forward_dtype="float32")
    assert attention_implementation("varlen", "cuda", 128) == "varlen"  # where torch has it (>= 2.10)
    assert attention_implementation("auto", "cuda", 128) != "varlen"  # opt-in until the GPU check has run


def test_the_verified_architectures_are_packing_verified_ones_that_use_transformers_attention_functions():
    assert VARLEN_VERIFIED < PACKING_VERIFIED
    assert {"falcon", "nemotron", "stablelm", "idefics3"} == PACKING_VERIFIED - VARLEN_VERIFIED


@pytest.mark.parametrize("family", [*WINDOWED, "falcon", "nemotron", "stablelm"])
def test_a_model_with_windows_soft_capping_or_its_own_attention_is_refused_before_it_loads(family):
    with pytest.raises(ConfigError, match=r"model.attention=varlen cannot run for this model: .*; use sdpa"):
        transformers_attention("varlen", family_config(family))


def test_a_run_asking_varlen_for_an_unverified_model_stops_naming_it(tmp_path):
    from transformers import AutoModelForCausalLM

    from reasonrl.models.load import load_model

    AutoModelForCausalLM.from_config(family_config("falcon")).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=f"cannot run for {tmp_path}: .*'falcon' architecture"):
        load_model(str(tmp_path), attn_implementation="varlen")


def torch_2_10_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's signature (no scale: always 1/√D; no grouped-query heads), computed by the CPU stand-in."""
    assert is_causal and key.shape[1] == query.shape[1] and torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    return segment_attention(query, key, value, cu_seq_q, max_q, None)


def later_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1), enable_gqa=False):  # fmt: skip
    """The later signature: causal as a window, the scale and grouped-query heads given."""
    assert tuple(window_size) == (-1, 0) and (enable_gqa or key.shape[1] == query.shape[1])
    return segment_attention(query, key, value, cu_seq_q, max_q, scale)


@pytest.mark.parametrize("kernel", [torch_2_10_varlen_attn, later_varlen_attn])
def test_the_kernel_is_called_as_each_torch_version_takes_it(kernel, monkeypatch):
    from torch.nn.attention import varlen

    from reasonrl.models.varlen_attention import varlen_kernel

    monkeypatch.setattr(varlen, "varlen_attn", kernel)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(30, 4, 8, generator=generator)
    k, v = (torch.randn(30, 2, 8, generator=generator) for _ in "kv")
    bounds = torch.tensor([0, 7, 19, 30], dtype=torch.int32)
    out = varlen_kernel(q, k, v, bounds, 12, 0.2)  # a scale other than 1/√8, two query heads per key head
    assert torch.allclose(out, segment_attention(q, k, v, bounds, 12, 0.2), atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torchs_varlen_kernel_on_a_gpu_gives_the_padded_sdpa_numbers():
    """The real kernel, bf16 under autocast on fp32 weights as the trainer runs: packed varlen against padded SDPA
    (bf16 tolerances), and against the CPU stand-in on the same inputs."""
    from reasonrl.models.varlen_attention import varlen_kernel

    generator = torch.Generator(device="cuda").manual_seed(0)
    lengths = [5, 17, 3, 40]
    bounds = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(sum(lengths), 4, 16, device="cuda", dtype=torch.bfloat16, generator=generator)
    k, v = (torch.randn(sum(lengths), 2, 16, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in "kv")
    out = varlen_kernel(q, k, v, bounds, max(lengths), 0.25)
    expected = segment_attention(q.float(), k.float(), v.float(), bounds.cpu(), max(lengths), 0.25)
    assert (out.float() - expected).abs().max() < 2e-2

    model = varlen_lm("qwen2").cuda()
    batch = long_tailed_batch()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        packed, padded = logprob_pass(model, batch, True), logprob_pass(model, batch, False)
    assert (packed[0] - padded[0]).abs().max() < 5e-2
    for name, grad in packed[2].items():
        assert torch.allclose(grad, padded[2][name], atol=5e-2, rtol=5e-2), name
