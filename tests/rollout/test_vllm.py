"""The vLLM engine: run only where CUDA and vLLM exist (skipped cleanly elsewhere)."""

import importlib.util

import pytest
import torch

from reasonrl.rollout import SamplingParams, build_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (pip install 'reasonrl[gpu]')"),
]


def test_vllm_engine_contract_and_weight_sync():
    from reasonrl.models.load import load_model, load_tokenizer

    model, tokenizer = load_model("smollm2-135m"), load_tokenizer("smollm2-135m")
    engine = build_engine("vllm", model, tokenizer)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"]] * 4
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1)
    first = engine.generate(prompts, params)
    assert engine.generate(prompts, params) == first  # seeded
    for c in first:
        assert 1 <= len(c.token_ids) <= 16 and len(c.logprobs) == len(c.token_ids)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in engine.stop_token_ids)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(prompts[:1], greedy)
    engine.load_weights({k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()})
    assert engine.generate(prompts[:1], greedy) != before
