"""model.attention=lanes (the CPU's packed layout): every op but attention reads the packed micro-batch's tokens
alone, as one sequence [1, N]; attention places them in lanes and back.  It gives the padded batch's numbers (rows
alone and rows sharing a prompt, eager-width and SDPA-width lanes, recomputed layers), builds no [N, N] mask, and
is SDPA everywhere else; a model it cannot run falls back to sdpa."""

import logging

import pytest
import torch

from reasonrl.models import varlen_attention
from reasonrl.models.forward import PROMPT_SHARING_VERIFIED, prompt_sharing_refusal, runs_in_lanes
from reasonrl.models.varlen_attention import LANE_ATTENTION, VARLEN_VERIFIED, transformers_attention
from reasonrl.training.update.policy import response_logprobs
from tests.models.test_packing import (
    family_config,
    logprob_pass,
    long_tailed_batch,
    shared_logprob_pass,
    shared_prompt_batch,
)
from tests.models.test_varlen_attention import plain_config


def lanes_lm(family: str):
    from transformers import AutoModelForCausalLM

    from reasonrl.models.load import without_dropout

    torch.manual_seed(0)
    config = plain_config(family)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=transformers_attention("lanes", config))
    return without_dropout(model.float())


@pytest.fixture
def lane_calls(monkeypatch):
    """The lanes each packed attention call computed: (lanes, width) per call."""
    calls = []
    real = varlen_attention.lane_attention_forward

    def recorded(module, query, key, value, attention_mask, *args, **kwargs):
        if kwargs.get("lane_layout") is not None:
            assert attention_mask is None  # no mask built for the packed sequence
            calls.append(tuple(kwargs["lane_layout"].mask.shape[::3]))
        return real(module, query, key, value, attention_mask, *args, **kwargs)

    from transformers import AttentionInterface

    transformers_attention("lanes", family_config("llama"))
    monkeypatch.setitem(AttentionInterface._global_mapping, LANE_ATTENTION, recorded)
    return calls


def assert_same_numbers(got, expected, atol=1e-5):
    assert torch.allclose(got[0], expected[0], atol=atol) and torch.allclose(got[1], expected[1], atol=atol)
    assert got[2].keys() == expected[2].keys() and len(got[2]) > 0
    for name, grad in got[2].items():
        assert torch.allclose(grad, expected[2][name], atol=atol), name


@pytest.mark.parametrize("family", sorted(VARLEN_VERIFIED))
def test_packed_rows_through_lanes_give_the_padded_batchs_numbers(family, lane_calls):
    model, batch = lanes_lm(family), long_tailed_batch()
    assert model.config._attn_implementation == LANE_ATTENTION and not runs_in_lanes(model.config)
    packed = logprob_pass(model, batch, True)
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    assert len(lane_calls) == model.config.num_hidden_layers  # every layer placed the tokens in lanes
    assert lane_calls[0][1] == max(lengths)  # lanes as wide as the longest row
    lane_calls.clear()
    padded = logprob_pass(model, batch, False)  # a padded batch: SDPA with its mask
    assert not lane_calls
    assert_same_numbers(packed, padded)


@pytest.mark.parametrize("family", sorted(PROMPT_SHARING_VERIFIED & VARLEN_VERIFIED))
def test_rows_sharing_a_prompt_read_it_once_through_lanes_with_the_padded_batchs_numbers(family, lane_calls):
    model, batch = lanes_lm(family), shared_prompt_batch()
    assert prompt_sharing_refusal(model.config, "cpu") is None
    shared = shared_logprob_pass(model, batch, True)
    read = batch.forward_tokens(packed=True, share_prompts=True, lanes=False)
    assert shared[3] == read == 17 + 64  # the backbone read 3 prompts once and 9 responses: no lane padding
    assert_same_numbers(shared[:3], logprob_pass(model, batch, False))


def test_lanes_wider_than_eager_takes_run_sdpa_with_the_same_numbers(monkeypatch, lane_calls):
    model, batch = lanes_lm("qwen2"), shared_prompt_batch()
    eager = shared_logprob_pass(model, batch, True)
    sdpa_calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(varlen_attention, "EAGER_ATTENTION_MAX_TOKENS", 8)  # every lane here is wider
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: sdpa_calls.append(1) or real_sdpa(*a, **k)
    )
    sdpa = shared_logprob_pass(model, batch, True)
    assert len(sdpa_calls) == model.config.num_hidden_layers
    assert_same_numbers(sdpa[:3], eager[:3])


def test_recomputed_layers_get_the_lanes_too(lane_calls):
    """Under gradient checkpointing the backward recomputes each layer with the same layout."""
    batch = shared_prompt_batch()
    expected = logprob_pass(lanes_lm("llama"), batch, False)
    model = lanes_lm("llama")
    model.gradient_checkpointing_enable()
    model.train()
    lane_calls.clear()
    assert_same_numbers(shared_logprob_pass(model, batch, True)[:3], expected)
    assert len(lane_calls) == 2 * model.config.num_hidden_layers  # forward, then each layer again in backward


def test_bf16_lanes_are_eager_attentions_numbers_in_lanes_of_every_op():
    """Under bf16 autocast (how the trainer runs) the lanes path computes what eager attention over whole lanes
    does: the same products on fewer rows."""
    from transformers import AutoModelForCausalLM

    batch = shared_prompt_batch()
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(plain_config("llama"), attn_implementation="eager").float()
    lanes = lanes_lm("llama")
    lanes.load_state_dict(eager.state_dict())
    out = [
        response_logprobs(m, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask,
                          compute_dtype=torch.bfloat16, share_prompts=True)[0]
        for m in (eager, lanes)
    ]  # fmt: skip
    mask = batch.response_mask
    assert (out[0] - out[1])[mask].abs().max() < 2e-2


def test_generate_with_a_lanes_model_is_sdpas_generate(lane_calls):
    model, reference = lanes_lm("qwen2"), lanes_lm("qwen2")
    reference.config._attn_implementation = "sdpa"
    prompts = torch.tensor([[0, 0, 5, 7, 9], [3, 4, 5, 6, 7]])
    options = dict(attention_mask=(prompts != 0).long(), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompts, **options), reference.generate(prompts, **options))
    assert not lane_calls


@pytest.mark.parametrize(("family", "default"), [("falcon", "sdpa"), ("gemma2", "eager")])
def test_a_model_lanes_cannot_run_gets_transformers_default_attention_saying_why(family, default, caplog):
    from transformers import AutoModelForCausalLM

    config = family_config(family)
    with caplog.at_level(logging.INFO, logger="reasonrl.models.varlen_attention"):
        chosen = transformers_attention("lanes", config)
    assert chosen is None and "model.attention=lanes runs transformers' default attention for this model" in caplog.text
    assert AutoModelForCausalLM.from_config(config, attn_implementation=chosen).config._attn_implementation == default


def test_eager_lanes_keep_one_bf16_probability_matrix_per_head_for_the_backward_pass():
    """What the lanes' eager attention saves for its backward pass is what bounds make demo's peak memory: one bf16
    [W, W] matrix per head (transformers' eager keeps an fp32 and a bf16 one), and its forward is eager's."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from reasonrl.models.varlen_attention import _eager_lanes

    generator = torch.Generator().manual_seed(0)
    lanes, heads, kv_heads, width, dim = 2, 4, 2, 24, 8
    q = torch.randn(lanes, heads, width, dim, generator=generator).bfloat16().requires_grad_()
    k, v = (torch.randn(lanes, kv_heads, width, dim, generator=generator).bfloat16().requires_grad_() for _ in "kv")
    mask = torch.ones(width, width, dtype=torch.bool).tril()[None, None].expand(lanes, 1, width, width)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = _eager_lanes(q, k, v, mask, dim**-0.5)
    square = [t for t in saved if t.shape[-2:] == (width, width) and t.dtype != torch.bool]
    assert {t.dtype for t in square} == {torch.bfloat16}
    assert len({t.data_ptr() for t in square}) == 1  # the softmax's output and the second matmul's input: one tensor
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = heads // kv_heads, False
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    expected, _ = eager_attention_forward(module, q, k, v, additive, scaling=dim**-0.5)  # [L, W, H, D]
    assert torch.allclose(out.transpose(1, 2).float(), expected.float(), atol=8e-3)  # bit for bit here; a bf16 ulp
