"""Preference math: hand-computed Bradley-Terry, verdict probabilities, debiasing, per-domain z-scores."""

import math

import pytest
import torch

from reasonrl.algo.preference import (
    bradley_terry_loss,
    domain_zscores,
    pairwise_accuracy,
    pairwise_judge_loss,
    position_debiased_reward,
    verdict_probability,
)


def test_bradley_terry_loss_hand_computed():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # −[log σ(1) + log σ(−1)] / 2 = [log(1 + e^−1) + log(1 + e^1)] / 2
    expected = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1))) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected)
    assert bradley_terry_loss(torch.tensor([0.0]), torch.tensor([0.0])).item() == pytest.approx(math.log(2))
    assert pairwise_accuracy(chosen, rejected) == 0.5
    assert pairwise_accuracy(torch.zeros(3), torch.zeros(3)) == 0.5  # ties: chance


def test_bradley_terry_gradient_pushes_scores_apart():
    chosen = torch.tensor([0.0], requires_grad=True)
    rejected = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    assert chosen.grad.item() == pytest.approx(-0.5) and rejected.grad.item() == pytest.approx(0.5)


def test_verdict_probability_is_the_two_token_softmax():
    logits = torch.tensor([[2.0, 0.5, -1.0]])  # tokens A, B and something else
    p = torch.softmax(logits, -1)[0]
    assert verdict_probability(logits[:, 0], logits[:, 1]).item() == pytest.approx((p[0] / (p[0] + p[1])).item())
    loss = pairwise_judge_loss(torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([True]))
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1.5))))


def test_position_debiased_reward_symmetry_and_parity():
    p_y_first, p_ref_first = torch.tensor([0.9, 0.3]), torch.tensor([0.6, 0.2])
    forward = position_debiased_reward(p_y_first, p_ref_first)  # R(y, y_ref)
    backward = position_debiased_reward(p_ref_first, p_y_first)  # R(y_ref, y)
    torch.testing.assert_close(forward + backward, torch.ones(2))
    torch.testing.assert_close(forward, torch.tensor([0.65, 0.55]))
    same = torch.tensor([0.8])  # a judge with a position bias, comparing a response with itself
    assert position_debiased_reward(same, same).item() == pytest.approx(0.5)


def test_domain_zscores_are_invariant_to_per_domain_affine_rescaling():
    scores = torch.tensor([0.1, 0.5, 0.9, 3.0, 1.0, 2.0, 7.0])
    domains = ["math", "math", "math", "chat", "chat", "chat", "solo"]
    rescaled = scores.clone()
    rescaled[:3] = 10 * rescaled[:3] - 4
    rescaled[3:6] = 0.01 * rescaled[3:6] + 100
    torch.testing.assert_close(domain_zscores(scores, domains), domain_zscores(rescaled, domains))
    z = domain_zscores(scores, domains)
    assert z[6] == 0 and z[:3].mean().abs() < 1e-9 and z[0] < z[1] < z[2]
