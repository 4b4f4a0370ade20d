"""Mechanism diagnostics (VC-PPO's value bias and reward decay, VAPO's λ by length) on hand-built batches."""

import math

import pytest
import torch

from reasonrl.algo.advantage_estimators import length_adaptive_lambda, reward_to_go
from reasonrl.algo.diagnostics import (
    bucket_means,
    edge_mean,
    explained_variance_by_position,
    position_buckets,
    reward_reach,
    token_ranks,
)


def lengths_mask(*lengths, width=None):
    width = width or max(lengths)
    return torch.arange(width)[None] < torch.tensor(lengths)[:, None]


def test_token_ranks_count_valid_tokens_only():
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert token_ranks(mask).tolist() == [[0, 1, -1, 2], [-1, -1, -1, -1]]


def test_edge_mean_reads_the_first_and_last_tenth_of_each_row():
    mask = lengths_mask(10, 3, 0)
    x = torch.zeros(3, 10)
    x[0] = torch.arange(1.0, 11.0)  # 1 … 10
    x[1, :3] = torch.tensor([5.0, 7.0, 9.0])
    x[2] = 1000.0  # no valid token: left out
    # ⌈0.1·10⌉ = 1 and ⌈0.1·3⌉ = 1 token per row
    assert edge_mean(x, mask, 0.1, "first").item() == pytest.approx((1 + 5) / 2)
    assert edge_mean(x, mask, 0.1, "last").item() == pytest.approx((10 + 9) / 2)
    # ⌈0.34·10⌉ = 4 and ⌈0.34·3⌉ = 2 tokens
    assert edge_mean(x, mask, 0.34, "first").item() == pytest.approx((2.5 + 6.0) / 2)
    assert edge_mean(x, mask, 0.34, "last").item() == pytest.approx((8.5 + 8.0) / 2)
    # fraction 0: exactly the first and the last token
    assert edge_mean(x, mask, 0.0, "last").item() == pytest.approx((10 + 9) / 2)


def test_edge_mean_takes_a_tenth_of_thirty_as_three_tokens_and_is_nan_without_tokens():
    x = torch.arange(30.0)[None]
    assert edge_mean(x, lengths_mask(30), 0.1, "first").item() == pytest.approx(1.0)  # (0 + 1 + 2) / 3
    assert math.isnan(edge_mean(x, torch.zeros(1, 30, dtype=torch.bool), 0.1, "first").item())


def test_position_buckets_are_thirds_of_each_row():
    buckets = position_buckets(lengths_mask(10, 3, 2), 3)
    assert buckets.tolist() == [
        [0, 0, 0, 0, 1, 1, 1, 2, 2, 2],
        [0, 1, 2, -1, -1, -1, -1, -1, -1, -1],
        [0, 1, -1, -1, -1, -1, -1, -1, -1, -1],
    ]


def test_explained_variance_per_third():
    returns = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    values = returns * torch.tensor([1.0, 0.0, -1.0])  # exact early, a constant 0 in the middle, wrong sign late
    ev = explained_variance_by_position(values, returns, lengths_mask(3, 3), 3)
    assert ev.tolist() == pytest.approx([1.0, 0.0, -3.0])  # 1 − Var(2G)/Var(G) = −3 late


def test_reward_reach_is_gamma_lambda_to_the_length_minus_one():
    lam = torch.tensor([0.95, 0.0, 0.5, 1.0])
    reach = reward_reach(lam, torch.tensor([100, 1, 3, 3]), 1.0)
    assert reach.tolist() == pytest.approx([0.95**99, 1.0, 0.25, 1.0])  # 0.95^99 ≈ 0.006: VC-PPO's decay
    assert reward_reach(torch.tensor([1.0]), torch.tensor([3]), 0.5).item() == pytest.approx(0.25)


def test_vapo_lambda_keeps_the_reach_near_exp_minus_one_over_alpha_at_any_length():
    lengths = torch.tensor([500, 1000, 2000])  # below the clamp λ ≤ 0.9999 (l ≤ 1/(α·0.0001) = 2000)
    reach = reward_reach(length_adaptive_lambda(lengths, 5.0), lengths, 1.0)
    assert reach.tolist() == pytest.approx([math.exp(-1 / 5)] * 3, rel=1e-3)


def test_bucket_means_split_rows_by_key_into_equal_groups():
    x = torch.tensor([10.0, 20, 30, 40, 50, 60, 70, 80])
    key = torch.tensor([8, 1, 7, 2, 6, 3, 5, 4])  # sorted by key: x = 20, 40, 60, 80, 70, 50, 30, 10
    assert bucket_means(x, key, 4).tolist() == pytest.approx([30.0, 70.0, 60.0, 20.0])
    few = bucket_means(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3, 2, 1]), 4)
    assert few[:3].tolist() == [3.0, 2.0, 1.0] and math.isnan(few[3].item())


def test_reward_to_go_discounts_the_outcome_reward():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    returns = reward_to_go(rewards, lengths_mask(3, width=4), 0.5)
    assert returns.tolist() == [[0.25, 0.5, 1.0, 0.0]]
