"""The mechanism metrics of the advantage stage (value bias, reward decay, VAPO's λ by length) on
hand-built batches whose GAE is worked out by hand."""

import math

import pytest
import torch

from reasonrl.algo.presets import AlgoSpec
from reasonrl.batch import RolloutBatch
from reasonrl.training.update.advantage_stage import assign_advantages, warn_lambda_clamped

GAE = AlgoSpec(advantage_estimator="gae", lambda_policy=0.5, lambda_critic=1.0, gamma=1.0)


def critic_batch(lengths, rewards, values):
    rows, width = len(lengths), max(lengths)
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    return RolloutBatch(
        prompt_ids=torch.ones(rows, 2, dtype=torch.long),
        prompt_mask=torch.ones(rows, 2, dtype=torch.bool),
        response_ids=torch.where(mask, 5, 0),
        response_mask=mask,
        policy_loss_mask=mask.clone(),
        value_loss_mask=mask.clone(),
        rollout_logprobs=torch.zeros(rows, width),
        rewards=torch.tensor(rewards),
        correct=torch.tensor(rewards) > 0,
        truncated=torch.zeros(rows, dtype=torch.bool),
        group_ids=torch.arange(rows),
        values=torch.tensor([v + [0.0] * (width - len(v)) for v in values]),
    )


def two_rows():
    # row 0: 4 tokens, reward 1, V rising 0.2 → 0.8; row 1: 2 tokens, reward 0, V = 0.2
    return critic_batch([4, 2], [1.0, 0.0], [[0.2, 0.4, 0.6, 0.8], [0.2, 0.2]])


def test_value_bias_and_reward_decay_metrics_by_hand():
    stats = assign_advantages(two_rows(), GAE, 0.0)
    # row 0: every δ = 0.2, so A = 0.375, 0.35, 0.3, 0.2 (λ = 0.5); row 1: δ = 0, −0.2, so A = −0.1, −0.2
    assert stats["critic/advantage_first_10pct"] == pytest.approx((0.375 - 0.1) / 2)
    assert stats["critic/advantage_last_10pct"] == pytest.approx((0.2 - 0.2) / 2, abs=1e-6)
    # Monte-Carlo returns 1 and 0: |0.2 − 1| and |0.2 − 0| first, |0.8 − 1| and |0.2 − 0| last
    assert stats["critic/value_error_first_token"] == pytest.approx((0.8 + 0.2) / 2)
    assert stats["critic/value_error_last_token"] == pytest.approx((0.2 + 0.2) / 2)
    # thirds: row 0's tokens fall in 0, 0, 1, 2 and row 1's in 0, 1
    # early: G = 1, 1, 0 and G − V = 0.8, 0.6, −0.2 -> 1 − 0.28 / (1/3); middle: G = 1, 0, G − V = 0.4, −0.2
    assert stats["critic/explained_variance_early"] == pytest.approx(1 - 0.28 * 3)
    assert stats["critic/explained_variance_middle"] == pytest.approx(1 - 0.18 / 0.5)
    assert math.isnan(stats["critic/explained_variance_late"])  # one token: the returns do not vary
    assert stats["policy/reward_reach_first_token"] == pytest.approx((0.5**3 + 0.5**1) / 2)
    assert "critic/lambda_policy_q1" not in stats  # a constant λ has no length quartiles


def test_value_metrics_leave_out_responses_outside_the_value_loss():
    plain = assign_advantages(two_rows(), GAE, 0.0)
    batch = critic_batch([4, 2, 3], [1.0, 0.0, 0.0], [[0.2, 0.4, 0.6, 0.8], [0.2, 0.2], [9.0, 9.0, 9.0]])
    batch.value_loss_mask[2] = False  # T-PPO: a running response, whose return is not known yet
    stats = assign_advantages(batch, GAE, 0.0)
    for key in ("value_error_first_token", "value_error_last_token", "explained_variance_early"):
        assert stats[f"critic/{key}"] == pytest.approx(plain[f"critic/{key}"]), key


def test_vapo_lambda_by_length_quartile_and_its_reward_reach():
    lengths = [5, 1, 8, 3, 2, 7, 4, 6]
    batch = critic_batch(lengths, [1.0] * 8, [[0.0] * n for n in lengths])
    spec = AlgoSpec(advantage_estimator="gae", lambda_policy_mode="length_adaptive", length_alpha=0.5)
    stats = assign_advantages(batch, spec, 0.0)
    lam = {n: max(0.0, 1 - 1 / (0.5 * n)) for n in range(1, 9)}  # 0, 0, 1/3, 1/2, 3/5, 2/3, 5/7, 3/4
    quartiles = [(lam[1] + lam[2]) / 2, (lam[3] + lam[4]) / 2, (lam[5] + lam[6]) / 2, (lam[7] + lam[8]) / 2]
    assert [stats[f"critic/lambda_policy_q{i}"] for i in (1, 2, 3, 4)] == pytest.approx(quartiles)
    assert stats["critic/lambda_policy_mean"] == pytest.approx(sum(lam.values()) / 8)
    reach = [lam[n] ** (n - 1) for n in lengths]  # 0^0 = 1: a one-token response gets its whole reward
    assert stats["policy/reward_reach_first_token"] == pytest.approx(sum(reach) / 8)
    # V ≡ 0, reward 1: the first token's advantage is exactly the reach
    first = batch.advantages[:, 0]
    assert sorted(first.tolist()) == pytest.approx(sorted(reach))


def test_length_adaptive_lambda_clamped_for_most_responses_is_warned_once(caplog):
    # α = 0.05: λ = 0 for responses of 20 tokens or fewer; three of these four are (the main job's answers)
    warn_lambda_clamped.cache_clear()  # an earlier test in this process may have warned already
    spec = AlgoSpec(advantage_estimator="gae", lambda_policy_mode="length_adaptive", length_alpha=0.05)
    lengths = [12, 20, 16, 30]
    for _ in range(2):
        batch = critic_batch(lengths, [1.0, 0.0, 0.0, 1.0], [[0.0] * n for n in lengths])
        assert assign_advantages(batch, spec, 0.0)["critic/lambda_clamped_fraction"] == 0.75
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "algo.length_alpha=0.05" in warnings[0] and "20 tokens or fewer" in warnings[0]
    # under half clamped: no warning
    caplog.clear()
    long_spec = AlgoSpec(advantage_estimator="gae", lambda_policy_mode="length_adaptive", length_alpha=0.04)
    batch = critic_batch([30, 40], [1.0, 0.0], [[0.0] * 30, [0.0] * 40])
    assert assign_advantages(batch, long_spec, 0.0)["critic/lambda_clamped_fraction"] == 0.0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
