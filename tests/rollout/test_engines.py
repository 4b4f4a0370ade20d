"""The engine contract, run against the scripted fake engine and the transformers engine."""

import pytest
import torch

from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.fake import FakeEngine
from reasonrl.train.policy import response_logprobs

STOP = 2


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random"), load_tokenizer("tiny-random")


def scripted(prompt, rng):
    length = rng.randint(1, 12)
    tokens = [rng.randint(3, 200) for _ in range(length)]
    return [*tokens, STOP] if rng.random() < 0.7 else tokens + [7] * 20


@pytest.fixture(params=["fake", "hf", "fast"])
def engine(request, tiny):
    if request.param == "fake":
        return FakeEngine(scripted, stop_token_ids=[STOP])
    model, tokenizer = tiny
    return build_engine(request.param, model, tokenizer, dtype=torch.float32, max_batch_sequences=3)


PROMPTS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]


def test_seeds_reproduce(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    first = engine.generate(PROMPTS, params)
    assert engine.generate(PROMPTS, params) == first
    other = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=1.0, seed=12))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]


def test_temperature_zero_is_deterministic(engine):
    a = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0, seed=1))
    b = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0, seed=2))
    assert a == b


@pytest.mark.parametrize("max_new_tokens", [1, 5, 16])
def test_max_tokens_finish_reasons_and_logprob_shapes(engine, max_new_tokens):
    completions = engine.generate(PROMPTS * 3, SamplingParams(max_new_tokens=max_new_tokens, seed=3))
    assert len(completions) == 12
    for c in completions:
        assert 1 <= len(c.token_ids) <= max_new_tokens
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 1e-6 for lp in c.logprobs)
        stops = [t for t in c.token_ids if t in engine.stop_token_ids]
        if c.finish_reason == "stop":
            assert stops == [c.token_ids[-1]]
        else:
            assert not stops and len(c.token_ids) == max_new_tokens


@pytest.mark.parametrize("name", ["hf", "fast"])
def test_logprobs_match_the_trainer_forward(tiny, name):
    model, tokenizer = tiny
    engine = build_engine(name, model, tokenizer, dtype=torch.float32, max_batch_sequences=3)
    for temperature in (1.0, 0.7):
        completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=temperature, seed=5))
        for prompt, c in zip(PROMPTS, completions, strict=True):
            lp, _ = response_logprobs(
                model,
                torch.tensor([prompt]),
                torch.ones(1, len(prompt), dtype=torch.bool),
                torch.tensor([c.token_ids]),
                torch.ones(1, len(c.token_ids), dtype=torch.bool),
                temperature=temperature,
            )
            torch.testing.assert_close(lp[0], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_hf_load_weights_changes_what_is_served(tiny):
    model, tokenizer = tiny
    engine = build_engine("hf", model, tokenizer, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = engine.generate(PROMPTS, params)
    state = {k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items()}
    engine.load_weights(state)
    assert engine.generate(PROMPTS, params) != before
    assert torch.equal(engine.model.state_dict()["lm_head.weight"], state["lm_head.weight"])
    assert not torch.equal(
        model.state_dict()["lm_head.weight"], state["lm_head.weight"]
    )  # the trainer's copy is untouched
