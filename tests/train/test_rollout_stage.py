"""The rollout stage: DAPO dynamic sampling fills the batch with informative groups only."""

import math

import pytest
import torch

from reasonrl.config import load_config, resolve
from reasonrl.data.examples import Example
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.models.load import load_tokenizer
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.reward.verifier_protocol import RewardResult
from reasonrl.rollout.engine_protocol import Completion
from reasonrl.rollout.fake import FakeEngine
from reasonrl.rollout.scored import Scored
from reasonrl.training.rollouts.rollout_stage import (
    DynamicSamplingError,
    Generated,
    RewardFailureError,
    RolloutCollector,
    RolloutSettings,
    build_batch,
)
from reasonrl.training.rollouts.rollout_stats import finished_stats
from reasonrl.training.run_inputs import data_spec
from tests.helpers import DigitFraction, RaisesOn


def collector(overrides, respond, verifier=None):
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
    pool = ScoringPool(verifier or DigitFraction(), workers=1, timeout=30)
    stream = TrainingStream(data_spec(cfg), seed=0)
    encoder = PromptEncoder(tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens)
    return RolloutCollector(RolloutSettings.of(cfg, resolve(cfg)), engine, tokenizer, pool, stream, encoder), pool


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


def test_a_scorer_that_fails_on_every_call_stops_dynamic_sampling_naming_itself():
    collect, pool = collector(["algo.max_generation_passes=3"], mixed_groups, verifier=RaisesOn(""))
    with pool, pytest.raises(RewardFailureError, match=r"^the built-in scorer failed on all 48 calls at step 1 "):
        collect.collect(1)  # every group all-wrong: the scorer is named, not the task's difficulty


def test_a_step_stops_when_the_share_of_failed_scoring_calls_reaches_the_setting():
    scored = [RewardResult(1.0, True)] * 3 + [RewardResult(0.0, False, {"error": "timeout after 10s"})]
    generated = Generated([[4] * 4], scored)
    generated.check_scoring(2, 1.0)  # one hang in four calls: the run goes on
    generated.check_scoring(2, 0.5)
    with pytest.raises(RewardFailureError, match=r"1 of 4 calls at step 2, 25% >= reward.max_error_fraction=0.25 "):
        generated.check_scoring(2, 0.25)
    # with reward.functions, each term by itself: one that fails on every call stops, whatever the others do
    terms = {"terms": {"ok": 1.0, "broken": None}, "term_errors": {"broken": "KeyError: 'x'"}}
    generated = Generated([[4] * 2], [RewardResult(1.0, True, terms)] * 2)
    assert generated.stats()["reward/fn/broken/errors"] == 2 and generated.stats()["reward/fn/ok/errors"] == 0
    with pytest.raises(RewardFailureError, match=r"^reward function 'broken' failed on all 2 calls at step 1 "):
        generated.check_scoring(1, 1.0)


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


def test_the_shared_rollout_statistics_hand_computed():
    # three responses of 2, 4 and 3 tokens; the second is still running (T-PPO) and does not count
    completions = [Completion([5, 6], [-1.0] * 2, "stop"), Completion([5] * 4, [-1.0] * 4, "length")]
    completions.append(Completion([5] * 3, [-1.0] * 3, "length"))
    results = [
        RewardResult(1.0, True, {"source": "math"}),
        RewardResult(0.0, False),
        RewardResult(0.0, False, {"source": "code", "error": "timeout"}),
    ]
    scored = Scored([Example(str(i), "q", "a", "math") for i in range(3)], [[1, 2]] * 3, completions, results)
    batch = build_batch(scored, torch.tensor([1.0, 9.0, -1.0]), torch.tensor([0, 0, 0]), filter_truncated=False)
    finished = torch.tensor([True, False, True])
    assert finished_stats(batch, finished, [results[0], results[2]]) == {
        "reward/mean": 0.0,  # (1 − 1) / 2
        "reward/accuracy": 0.5,
        "rollout/response_length": 2.5,  # (2 + 3) / 2
        "rollout/response_length_max": 3.0,
        "rollout/truncated_fraction": 0.5,
        "reward/math/mean": 1.0,
        "reward/math/fraction": 0.5,
        "reward/code/mean": 0.0,
        "reward/code/fraction": 0.5,
    }
    nothing = finished_stats(batch, torch.zeros(3, dtype=torch.bool), [])
    assert all(math.isnan(value) for value in nothing.values()) and len(nothing) == 5
    # two engine calls of 2 and 4 responses: 2 + 4 + (3 + 3 + 1 + 1) tokens; one error in four verdicts
    generated = Generated([[2, 4], [3, 3, 1, 1]], [results[0], results[2], results[1], results[1]])
    stats = generated.stats()
    assert stats["reward/error_fraction"] == 0.25 and stats["rollout/tokens_generated"] == 14.0
    # slot utilisation per call: 6 / (2·4) = 0.75 over 4 decode steps, 8 / (4·3) = 2/3 over 3 steps
    assert stats["rollout/slot_utilisation"] == pytest.approx((4 * 0.75 + 3 * 2 / 3) / 7)
    assert stats["rollout/idle_slot_steps"] == (2 * 4 - 6) + (4 * 3 - 8)


def test_a_shaped_reward_past_float32_fails_its_row_only(caplog):
    """A score mapped onto a reward scale float32 cannot hold is inf (or NaN) in the batch, where one would turn
    every advantage NaN: that row fails as a failed scoring call does (counted by the step's error share), the
    others keep their rewards."""
    from reasonrl.training.rollouts.rollout_stage import refuse_unheld_rewards

    results = [RewardResult(1.0, True, {"extracted": "7"}), RewardResult(0.0, False)]
    scored = Scored([example_row()] * 2, [[1, 2]] * 2, [Completion([3], [0.0], "stop")] * 2, results)
    rewards = refuse_unheld_rewards(scored, torch.tensor([float("inf"), -1.0]), failed_reward=-2.0)
    assert rewards.tolist() == [-2.0, -1.0]
    assert not scored.results[0].correct and "beyond float32's range" in scored.results[0].info["error"]
    assert scored.results[0].info["extracted"] == "7" and scored.results[1] is results[1]
    assert Generated([[1, 1]], scored.results).stats()["reward/error_fraction"] == 0.5
    assert "a shaped reward is beyond float32's range" in caplog.text


def example_row():
    return Example("a:7", "What is 3 + 4?", "7")
