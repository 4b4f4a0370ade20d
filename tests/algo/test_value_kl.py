"""Clipped value loss, explained variance, KL estimators and controllers (verl, Schulman 2020, Ziegler et al. 2019)."""

import math

import pytest
import torch

from reasonrl.algo.kl import AdaptiveKLController, FixedKLController, kl_estimate, kl_penalized_rewards
from reasonrl.algo.value_loss import explained_variance, value_loss


def test_value_loss_hand_computed_clipped_and_unclipped():
    # token 0: V = 1.0, V_old = 0, G = 2, ε_v = 0.5: (V − G)² = 1, clip(V) = 0.5 -> (0.5 − 2)² = 2.25;
    #          max = 2.25 -> ½·2.25 = 1.125, the clipped branch is flat in V: gradient 0
    # token 1: V = 0.2, V_old = 0, G = 1: inside the clip range, ½·0.64 = 0.32, dL/dV = V − G = −0.8
    values = torch.tensor([[1.0, 0.2]], requires_grad=True)
    loss, stats = value_loss(
        values, torch.zeros(1, 2), torch.tensor([[2.0, 1.0]]), torch.ones(1, 2), 0.5, "seq-mean-token-sum"
    )
    assert loss.item() == pytest.approx(1.125 + 0.32)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.8]]))
    plain, _ = value_loss(values, torch.zeros(1, 2), torch.tensor([[2.0, 1.0]]), torch.ones(1, 2), None, "token-mean")
    assert plain.item() == pytest.approx((0.5 * 1.0 + 0.5 * 0.64) / 2)


def test_value_loss_gives_zero_gradient_to_tokens_outside_the_mask():
    # T-PPO (f): a truncated sequence is out of value_loss_mask -> exactly zero gradient for its tokens
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 5, generator=g, requires_grad=True)
    returns = torch.randn(3, 5, generator=g)
    truncated = torch.tensor([False, True, False])
    value_mask = torch.ones(3, 5, dtype=torch.bool) & ~truncated[:, None]
    old = torch.where(value_mask, values.detach(), torch.full((3, 5), float("nan")))
    loss, _ = value_loss(values, old, returns, value_mask, 0.5, "token-mean")
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.equal(values.grad[1], torch.zeros(5))
    assert torch.all(values.grad[0] != 0)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.5), returns, mask).item() == pytest.approx(0.0)
    # V = G − [1, −1, 1, −1]: Var(G − V) = 4/3, Var(G) = 5/3 -> EV = 1 − 0.8 = 0.2
    noisy = returns - torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    assert explained_variance(noisy, returns, mask).item() == pytest.approx(0.2)
    assert math.isnan(explained_variance(returns, torch.ones(1, 4), mask).item())


def test_kl_estimators_hand_computed():
    # d = log 2: k1 = 0.6931, k2 = ½·0.4805 = 0.2402, k3 = ½ + 0.6931 − 1 = 0.1931
    lp, ref = torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1)
    d = math.log(2.0)
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(d)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + d - 1)
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_estimate(lp, ref, "k4")


def test_k3_is_non_negative_and_zero_at_equality():
    # §1.12 #11
    g = torch.Generator().manual_seed(0)
    lp, ref = 5 * torch.randn(100, generator=g), 5 * torch.randn(100, generator=g)
    assert torch.all(kl_estimate(lp, ref, "k3") >= 0)
    assert torch.equal(kl_estimate(lp, lp, "k3"), torch.zeros(100))
    assert torch.isfinite(kl_estimate(torch.tensor([500.0]), torch.tensor([-500.0]), "k3")).all()


def test_kl_in_reward_is_subtracted_on_valid_tokens_only():
    out = kl_penalized_rewards(
        torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 1.0, 9.0]]), 0.1, torch.tensor([[1, 1, 0]])
    )
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.9, 0.0]]))


def test_kl_controllers():
    fixed = FixedKLController(0.04)
    fixed.update(torch.tensor(10.0), 64)
    assert fixed.coef == 0.04
    adaptive = AdaptiveKLController(0.1, target=0.1, horizon=1000)
    adaptive.update(torch.tensor(1.0), 100)  # KL 10× target: error clipped to +0.2 -> β·(1 + 0.2·0.1)
    assert float(adaptive.coef) == pytest.approx(0.1 * 1.02)
    adaptive.update(torch.tensor(0.09), 100)  # error −0.1 -> β·(1 − 0.01)
    assert float(adaptive.coef) == pytest.approx(0.1 * 1.02 * 0.99)
