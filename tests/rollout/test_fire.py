"""FIRE sampling (arXiv:2410.21236): flaming-hot first tokens, regular sampling after them."""

import pytest
import torch

from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.sampling import FireParams, sample_tokens, sampling_logprobs
from tests.rollout.test_engines import PAGED

CHI2_DF15_P001 = 37.70  # χ² critical value, 15 degrees of freedom, p = 0.001
N = 32_000


def logits_row(seed=0, vocab=300):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def uniforms(rows: int, seed: int) -> torch.Tensor:
    return torch.rand(rows, generator=torch.Generator().manual_seed(seed))


def chi2(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    expected = expected_probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def fire_counts(z, fire, temperature=1.0, top_k=None, seed=1):
    logits = z.expand(N, -1)
    tokens, _ = sample_tokens(logits, temperature, top_k, 1.0, uniforms(N, seed), torch.ones(N, dtype=torch.bool), fire)
    top = torch.topk(z, fire.top_k).indices
    assert torch.isin(tokens, top).all(), "a FIRE token fell outside the top-k"
    return torch.stack([(tokens == t).sum() for t in top]).float(), top


def test_infinite_temperature_is_uniform_over_the_top_k():
    z = logits_row()
    counts, _ = fire_counts(z, FireParams(temperature=1e6, top_k=16))
    assert chi2(counts, torch.full((16,), 1 / 16)) < CHI2_DF15_P001


def test_default_fire_matches_softmax_of_the_top_16_at_temperature_30():
    z = logits_row(3) * 4  # spread wide enough that T = 30 is measurably not uniform
    counts, top = fire_counts(z, FireParams())
    expected = torch.softmax(z[top] / 30, dim=0)
    assert chi2(counts, expected) < CHI2_DF15_P001
    assert chi2(counts, torch.full((16,), 1 / 16)) > CHI2_DF15_P001  # ... and is not exactly uniform


def test_regular_settings_never_override_the_fire_parameters():
    z = logits_row(3)
    counts, top = fire_counts(z, FireParams(), temperature=0.3, top_k=2)
    assert chi2(counts, torch.softmax(z[top] / 30, dim=0)) < CHI2_DF15_P001


def test_rows_after_the_first_token_sample_exactly_as_without_fire():
    z = torch.randn(64, 300, generator=torch.Generator().manual_seed(5))
    fire_rows = torch.arange(64) % 4 == 0
    plain, plain_lp = sample_tokens(z, 1.0, None, 1.0, uniforms(64, 7))
    mixed, mixed_lp = sample_tokens(z, 1.0, None, 1.0, uniforms(64, 7), fire_rows, FireParams())
    assert torch.equal(plain[~fire_rows], mixed[~fire_rows])
    assert torch.equal(plain_lp[~fire_rows], mixed_lp[~fire_rows])
    # the reported log-prob of a FIRE token is under the FIRE distribution
    hot = sampling_logprobs(z[fire_rows], 30.0, 16, 1.0)
    torch.testing.assert_close(mixed_lp[fire_rows], hot.gather(1, mixed[fire_rows][:, None]).squeeze(1))


@pytest.mark.parametrize("name", ["hf", "fast", PAGED])
def test_engines_sample_the_first_token_flaming_hot(name):
    model, tokenizer = load_model("tiny-random"), load_tokenizer("tiny-random")
    engine = build_engine(name, model, tokenizer, dtype=torch.float32)
    prompt = [1, 50, 60, 70]
    params = SamplingParams(max_new_tokens=6, temperature=0.7, seed=3, fire=FireParams())
    completions = engine.generate([prompt] * 4, params)
    with torch.no_grad():
        last_logits = model(torch.tensor([prompt])).logits[0, -1]
    hot = sampling_logprobs(last_logits[None], 30.0, 16, 1.0)[0]
    for c in completions:
        assert 1 <= len(c.token_ids) <= 6
        assert hot[c.token_ids[0]] > float("-inf")  # drawn from the top-16
        assert c.logprobs[0] == pytest.approx(hot[c.token_ids[0]].item(), abs=1e-4)
