"""The rollout stage: DAPO dynamic sampling fills the batch with informative groups only."""

import pytest
import torch

from reasonrl.config import load_config, resolve
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.models.load import load_tokenizer
from reasonrl.reward.pool import ScoringPool
from reasonrl.rollout.fake import FakeEngine
from reasonrl.train.loop import data_spec
from reasonrl.train.rollout import DynamicSamplingError, RolloutCollector
from tests.helpers import DigitFraction


def collector(overrides, respond):
    cfg = load_config(
        "dapo",
        [
            "model.name_or_path=tiny-random",
            "rollout.rollout_prompts=4",
            "rollout.samples_per_prompt=4",
            "rollout.max_response_tokens=16",
            "train.minibatch_sequences=16",
            *overrides,
        ],
    )
    tokenizer = load_tokenizer("tiny-random")
    engine = FakeEngine(respond(tokenizer), stop_token_ids=[tokenizer.eos_token_id])
    pool = ScoringPool(DigitFraction(), workers=1, timeout=30)
    stream = TrainingStream(data_spec(cfg), seed=0)
    encoder = PromptEncoder(tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens)
    return RolloutCollector(cfg, resolve(cfg), engine, tokenizer, pool, stream, encoder), pool


def mixed_groups(tokenizer):
    digit, letter = tokenizer.convert_tokens_to_ids("7"), tokenizer.convert_tokens_to_ids("x")

    def respond(prompt, rng):
        kind = sum(prompt) % 3  # 0: every sample right, 1: every sample wrong, 2: a coin flip per sample
        right = kind == 0 or (kind == 2 and rng.random() < 0.5)
        return [digit if right else letter] * 6 + [tokenizer.eos_token_id]

    return respond


def test_dynamic_sampling_keeps_only_informative_groups_and_fills_the_batch():
    collect, pool = collector([], mixed_groups)
    with pool:
        for step in (1, 2, 3):
            batch, stats = collect.collect(step)
            assert len(batch) == 16  # exactly rollout_prompts × samples_per_prompt
            for group in batch.group_ids.unique():
                correct = batch.correct[batch.group_ids == group]
                assert 0 < correct.sum() < len(correct), "a constant group reached the batch"
            assert stats["rollout/kept_group_fraction"] < 1.0
            assert stats["rollout/generation_passes"] >= 1


def test_without_dynamic_sampling_constant_groups_stay():
    collect, pool = collector(["algo.dynamic_sampling=false"], mixed_groups)
    with pool:
        batch, stats = collect.collect(1)
    assert len(batch) == 16 and stats["rollout/generation_passes"] == 1


def test_dynamic_sampling_gives_up_with_advice():
    def all_wrong(tokenizer):
        return lambda prompt, rng: [tokenizer.convert_tokens_to_ids("x")] * 3

    collect, pool = collector(["algo.max_generation_passes=3"], all_wrong)
    with pool, pytest.raises(DynamicSamplingError, match="after 3 generation passes"):
        collect.collect(1)


def test_soft_overlong_penalty_and_truncation_flags():
    def long_answers(tokenizer):
        digit = tokenizer.convert_tokens_to_ids("7")
        return lambda prompt, rng: [digit] * rng.randint(5, 40) + [tokenizer.eos_token_id]

    collect, pool = collector(["algo.dynamic_sampling=false", "reward.incorrect_score=0.0"], long_answers)
    with pool:
        batch, _ = collect.collect(1)
    lengths = batch.response_mask.sum(1)
    # cap 16, cache 20% = 3: length 16 (truncated) gets −1; ≤ 13 gets 0; correct (all digits) gets 1
    expected = 1.0 + torch.clamp((13 - lengths.float()) / 3, -1, 0)
    torch.testing.assert_close(batch.rewards, expected)
    assert batch.truncated.any() and not batch.truncated.all()
    assert torch.equal(batch.truncated, batch.response_ids[:, 15] == collect.tokenizer.convert_tokens_to_ids("7"))


def test_fire_tokens_are_masked_out_of_the_policy_loss_by_default():
    collect, pool = collector(["algo.dynamic_sampling=false", "rollout.fire.enabled=true"], mixed_groups)
    with pool:
        batch, _ = collect.collect(1)
    assert not batch.policy_loss_mask[:, 0].any()
    assert torch.equal(batch.policy_loss_mask[:, 1:], batch.response_mask[:, 1:])
    collect, pool = collector(
        ["algo.dynamic_sampling=false", "rollout.fire.enabled=true", "rollout.fire.logprob=behaviour"], mixed_groups
    )
    with pool:
        batch, _ = collect.collect(1)
    assert torch.equal(batch.policy_loss_mask, batch.response_mask)  # kept: old log-probs come from the sampler
