"""Critic-free estimators: GRPO / Dr. GRPO, RLOO, REINFORCE++ and the dynamic-sampling filter."""

import math

import pytest
import torch

from reasonrl.algo.advantage_estimators import (
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_to_tokens,
)
from reasonrl.algo.shaping import nonconstant_group_mask


def test_group_advantages_hand_computed():
    # group 7: R = [1, 0, 0], mean 1/3, unbiased std = sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3)
    #   A = (1 − 1/3)/sqrt(1/3) = 1.1547,  (0 − 1/3)/sqrt(1/3) = −0.57735
    # group 3: a singleton: mean 0, std 1 -> A = R/(1 + eps)
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([7, 7, 7, 3])
    adv = group_advantages(rewards, groups, eps=0.0)
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(adv, torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 5.0]))


def test_group_advantages_population_std_and_dr_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    groups = torch.zeros(3, dtype=torch.long)
    # population std = sqrt(2/9): A_0 = (2/3)/sqrt(2/9) = sqrt(2)
    biased = group_advantages(rewards, groups, eps=0.0, unbiased=False)
    assert biased[0].item() == pytest.approx(math.sqrt(2))
    # Dr. GRPO: no std division, A = R − mean
    torch.testing.assert_close(group_advantages(rewards, groups, norm_by_std=False), rewards - 1 / 3)


def test_group_advantages_sum_to_zero_and_constant_groups_vanish():
    # §1.12 #6
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(24, generator=g)
    groups = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=g)]
    adv = group_advantages(rewards, groups)
    for gid in range(6):
        assert adv[groups == gid].sum().item() == pytest.approx(0.0, abs=1e-9)
    flat = group_advantages(torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(flat, torch.zeros(5))


def test_group_ids_need_not_be_contiguous_or_sorted():
    rewards = torch.tensor([3.0, 1.0, 2.0, 0.0])
    a = group_advantages(rewards, torch.tensor([100, 5, 100, 5]))
    b = group_advantages(rewards[[0, 2, 1, 3]], torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(a[[0, 2, 1, 3]], b)


def test_rloo_hand_computed():
    # group: R = [1, 0, 0]: A0 = 1 − (0+0)/2 = 1, A1 = 0 − (1+0)/2 = −0.5, A2 = −0.5; singleton 4.0 -> 4.0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 4.0]), torch.tensor([0, 0, 0, 1]))
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5, 4.0]))


def test_rloo_is_scaled_group_mean_baseline():
    # A_rloo = G/(G−1)·(R − mean)
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(12, generator=g)
    groups = torch.arange(3).repeat_interleave(4)
    expected = 4 / 3 * group_advantages(rewards, groups, norm_by_std=False)
    torch.testing.assert_close(rloo_advantages(rewards, groups), expected)


def test_reinforce_pp_returns_and_whitening():
    # r = [[0, 1, 0(pad)], [2, 0, 3]], γ = 0.5: returns [[0.5, 1, 0], [2 + 0 + 0.75, 1.5, 3]]
    rewards = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = reinforce_pp_advantages(rewards, mask, 0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.5, 1.0, 0.0], [2.75, 1.5, 3.0]]))
    valid = adv[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert valid.std().item() == pytest.approx(1.0, rel=1e-6)
    assert adv[0, 2].item() == 0.0


def test_sequence_to_tokens_broadcasts_only_valid_tokens():
    out = sequence_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_nonconstant_group_mask_drops_all_correct_and_all_wrong_groups():
    # DAPO (f): groups with all-1 or all-0 accuracy never reach the optimiser; singletons are kept
    acc = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 1, 0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 4])
    keep = nonconstant_group_mask(acc, groups)
    assert keep.tolist() == [False, False, False, False, False, False, True, True, True, True]
