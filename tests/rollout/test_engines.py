"""The engine contract, run against the scripted fake engine, hf, fast, paged (transformers' continuous batching)
and vLLM (`make test-vllm`)."""

import importlib.util

import pytest
import torch

from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.fake import FakeEngine
from reasonrl.training.update.policy import response_logprobs

STOP = 2


def paged_available() -> bool:
    """Whether this transformers has the continuous batching the paged engine needs (log-probs and seeds)."""
    from reasonrl.models.load import ModelError
    from reasonrl.rollout.paged import continuous_batching_config

    try:
        continuous_batching_config()
    except ModelError:
        return False
    return True


PAGED = pytest.param(
    "paged",
    marks=pytest.mark.skipif(not paged_available(), reason="this transformers lacks continuous batching log-probs"),
)
VLLM = pytest.param(
    "vllm",
    marks=[
        pytest.mark.vllm,
        pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (make test-vllm)"),
    ],
)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random"), load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def vllm_engine(tiny_vllm):
    """One vLLM engine for the module (start-up takes seconds); tests that change its weights restore them."""
    options = {"max_model_len": 256, "enforce_eager": True, "cpu_kv_cache_gib": 1}
    return build_engine("vllm", *tiny_vllm, options, dtype=torch.float32, max_batch_sequences=3)


def served(request, name):
    """(trainer model, engine serving it) for engine ``name``, fp32."""
    if name == "vllm":
        return request.getfixturevalue("tiny_vllm")[0], request.getfixturevalue("vllm_engine")
    model, tokenizer = request.getfixturevalue("tiny")
    return model, build_engine(name, model, tokenizer, dtype=torch.float32, max_batch_sequences=3)


def scripted(prompt, rng):
    length = rng.randint(1, 12)
    tokens = [rng.randint(3, 200) for _ in range(length)]
    return [*tokens, STOP] if rng.random() < 0.7 else tokens + [7] * 20


@pytest.fixture(params=["fake", "hf", "fast", PAGED, VLLM])
def engine(request):
    if request.param == "fake":
        return FakeEngine(scripted, stop_token_ids=[STOP])
    return served(request, request.param)[1]


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


@pytest.mark.parametrize("name", ["hf", "fast", PAGED, VLLM])
def test_logprobs_match_the_trainer_forward(request, name):
    model, engine = served(request, name)
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


@pytest.mark.parametrize("name", ["hf", "fast", PAGED, VLLM])
def test_load_weights_changes_what_is_served(request, name):
    model, engine = served(request, name)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = engine.generate(PROMPTS, params)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    noise = torch.Generator().manual_seed(0)  # fixed: near-ties of greedy decoding must not depend on test order
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=noise, dtype=v.dtype) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # tied, as the trainer's are
    engine.load_weights(perturbed)
    after = engine.generate(PROMPTS, params)
    assert after != before
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())  # the trainer's copy is untouched
    model.load_state_dict(perturbed)  # the engine now serves exactly these weights: greedy as the trainer's
    assert [c.token_ids for c in after] == greedy_tokens(model, PROMPTS, 6)
    model.load_state_dict(original)
    engine.load_weights(original)
    assert engine.generate(PROMPTS, params) == before


def greedy_tokens(model, prompts, max_new_tokens):
    """The trainer model's own greedy continuations (no stop tokens at 6 tokens of a random model)."""
    out = []
    for prompt in prompts:
        ids = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        out.append(ids[0, len(prompt) :].tolist())
    return out


def test_fast_engine_matches_hf_greedy_in_fp32(tiny):
    model, tokenizer = tiny
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    hf = build_engine("hf", model, tokenizer, dtype=torch.float32).generate(PROMPTS, params)
    fast = build_engine("fast", model, tokenizer, dtype=torch.float32, max_batch_sequences=2).generate(PROMPTS, params)
    assert [c.token_ids for c in fast] == [c.token_ids for c in hf]
    for a, b in zip(hf, fast, strict=True):
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)


def test_fast_engine_serves_more_prompts_than_slots_in_order(tiny):
    # continuous batching: a finished slot takes the next prompt; a reused slot's old cache never leaks
    model, tokenizer = tiny
    engine = build_engine("fast", model, tokenizer, dtype=torch.float32, max_batch_sequences=2)
    prompts = [[1, 10 + i, 20 + i] for i in range(7)]
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    together = engine.generate(prompts, params)
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]


def test_repeated_prompts_share_one_prefill_and_sample_independently(tiny):
    model, tokenizer = tiny
    engine = build_engine("fast", model, tokenizer, dtype=torch.float32, max_batch_sequences=8)
    completions = engine.generate([PROMPTS[0]] * 8, SamplingParams(max_new_tokens=8, temperature=1.0, seed=4))
    assert len({tuple(c.token_ids) for c in completions}) > 1
    greedy = engine.generate([PROMPTS[0]] * 3, SamplingParams(max_new_tokens=8, temperature=0.0))
    single = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    assert greedy[0] == greedy[1] == greedy[2] == single


@pytest.mark.parametrize("name", ["hf", "fast", PAGED, VLLM])
def test_ignore_stop_generates_exactly_max_new_tokens(request, name):
    engine = served(request, name)[1]
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=9, seed=2, ignore_stop=True))
    assert all(len(c.token_ids) == 9 and c.finish_reason == "length" for c in completions)


@pytest.fixture(params=["fast", VLLM])
def per_request_engine(request):
    return served(request, request.param)[1]


def test_a_completion_depends_on_its_own_seed_and_index_not_on_the_rest_of_the_batch(per_request_engine):
    """What data-parallel generation rests on: a rank generating prompts 2.. of a batch (first_index=2)
    samples exactly what one process generating the whole batch samples for them."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)
    whole = per_request_engine.generate(PROMPTS, params)
    share = per_request_engine.generate(
        PROMPTS[2:], SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, first_index=2)
    )
    assert [c.token_ids for c in share] == [c.token_ids for c in whole[2:]]
    torch.testing.assert_close([c.logprobs for c in share], [c.logprobs for c in whole[2:]], atol=1e-5, rtol=0)
    shifted = per_request_engine.generate(PROMPTS[2:], params)  # same prompts at other indices: other streams
    assert [c.token_ids for c in shifted] != [c.token_ids for c in whole[2:]]


def test_fast_engine_keeps_decoding_when_an_idle_slot_ended_at_the_cache_edge(tiny):
    # Two slots end together with their next position at the KV cache's block edge (3 prompt + 30 new
    # tokens - 1 = 32 = CACHE_BLOCK) and one prompt left: the slot that stays idle must not write past
    # the cache (a GSM8K run crashed with "index 256 is out of bounds for dimension 1 with size 256").
    model, tokenizer = tiny
    engine = build_engine("fast", model, tokenizer, dtype=torch.float32, max_batch_sequences=2)
    params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=3, ignore_stop=True)
    prompts = [[1, 40, 41], [1, 50, 51], [1, 60, 61]]
    completions = engine.generate(prompts, params)
    assert [len(c.token_ids) for c in completions] == [30, 30, 30]
    one_slot = build_engine("fast", model, tokenizer, dtype=torch.float32, max_batch_sequences=1)
    assert [c.token_ids for c in one_slot.generate(prompts, params)] == [c.token_ids for c in completions]
