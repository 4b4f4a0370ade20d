"""PPO clip with Clip-Higher and dual-clip, and VAPO's positive-example NLL (DAPO eq 10, VAPO eq 9)."""

import math

import pytest
import torch

from reasonrl.algo.aggregate import aggregate
from reasonrl.algo.policy_loss import positive_example_nll, ppo_clip


def one_token_loss(ratio, advantage, eps_low=0.2, eps_high=0.28, dual_clip=None):
    """Loss and d loss / d logπ_θ for one token with old log-prob 0 (so ρ = exp(logπ_θ))."""
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = ppo_clip(
        logprob, torch.zeros(1, 1), torch.tensor([[advantage]]), torch.ones(1, 1), eps_low, eps_high, dual_clip
    )
    loss.sum().backward()
    return loss.item(), logprob.grad.item(), stats


def test_ppo_clip_hand_computed():
    # ρ = 1.1, A = 2: unclipped −2.2, clipped −2.2 -> −2.2; d/dlogπ = −A·ρ = −2.2
    assert one_token_loss(1.1, 2.0)[:2] == pytest.approx((-2.2, -2.2))
    # ρ = 1.5, A = +1, ε_high = 0.28: max(−1.5, −1.28) = −1.28, gradient cut
    assert one_token_loss(1.5, 1.0)[:2] == pytest.approx((-1.28, 0.0))
    # ρ = 0.5, A = −1, ε_low = 0.2: max(0.5, 0.8) = 0.8, gradient cut
    assert one_token_loss(0.5, -1.0)[:2] == pytest.approx((0.8, 0.0))
    # ρ = 0.5, A = +1: max(−0.5, −0.8) = −0.5 (pessimistic bound keeps the gradient): −A·ρ = −0.5
    assert one_token_loss(0.5, 1.0)[:2] == pytest.approx((-0.5, -0.5))


def test_clip_higher_gradient_conditions():
    # §1.12 #10: A > 0 -> gradient vanishes exactly when ρ > 1 + ε_high; A < 0 -> when ρ < 1 − ε_low
    for ratio in (0.5, 0.9, 1.0, 1.2, 1.27, 1.29, 2.0):
        grad = one_token_loss(ratio, 1.0)[1]
        assert (grad == 0.0) == (ratio > 1.28), ratio
    for ratio in (0.1, 0.79, 0.81, 1.0, 1.5, 3.0):
        grad = one_token_loss(ratio, -1.0)[1]
        assert (grad == 0.0) == (ratio < 0.8), ratio
    # asymmetry: ρ = 1.25, A = +1 keeps its gradient with ε_high = 0.28 but not with a symmetric 0.2
    assert one_token_loss(1.25, 1.0)[1] != 0.0
    assert one_token_loss(1.25, 1.0, eps_high=0.2)[1] == 0.0


def test_dapo_paper_example_low_probability_token():
    # DAPO §3.1: π_old = 0.01, A > 0: with ε_high = 0.28 the gradient survives until π_θ = 0.0128,
    # with ε = 0.2 it stops at 0.012
    old = torch.full((1, 1), math.log(0.01))
    for p_new, eps_high, alive in (
        (0.0125, 0.28, True),
        (0.0129, 0.28, False),
        (0.0125, 0.2, False),
        (0.0119, 0.2, True),
    ):
        logprob = torch.full((1, 1), math.log(p_new), requires_grad=True)
        loss, _ = ppo_clip(logprob, old, torch.ones(1, 1), torch.ones(1, 1), 0.2, eps_high)
        loss.sum().backward()
        assert (logprob.grad.item() != 0.0) == alive, (p_new, eps_high)


def test_dual_clip_caps_negative_advantage_loss():
    # ρ = 5, A = −1: PPO loss max(5, 1.28) = 5; dual-clip c = 3 caps it at −c·A = 3, gradient cut
    loss, grad, stats = one_token_loss(5.0, -1.0, dual_clip=3.0)
    assert (loss, grad) == pytest.approx((3.0, 0.0))
    assert stats["dual_clip_frac"].item() == 1.0
    # below the cap nothing changes; positive advantages are never dual-clipped
    assert one_token_loss(2.0, -1.0, dual_clip=3.0)[:2] == pytest.approx((2.0, 2.0))
    assert one_token_loss(5.0, 1.0, dual_clip=3.0)[:2] == pytest.approx((-1.28, 0.0))


def test_clip_fraction_stats():
    logprobs = torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    _, stats = ppo_clip(logprobs, torch.zeros(1, 4), adv, torch.ones(1, 4), 0.2, 0.28)
    assert stats["clip_frac_high"].item() == pytest.approx(0.25)
    assert stats["clip_frac_low"].item() == pytest.approx(0.25)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 1 + 0.5 + 1) / 4)


def test_masked_tokens_never_change_loss_or_gradient():
    # §1.12 #12: a token with policy_loss_mask = 0 cannot change the loss, even if it holds NaN/inf
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=g)
    old = -torch.rand(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.4

    def loss_and_grad(lp, a):
        lp = lp.clone().requires_grad_(True)
        per_token, _ = ppo_clip(lp, old, a, mask, 0.2, 0.28, dual_clip=3.0)
        loss = aggregate(per_token, mask, "token-mean")
        loss.backward()
        return loss.detach(), lp.grad

    base_loss, base_grad = loss_and_grad(logprobs, adv)
    poisoned_lp = torch.where(mask, logprobs, torch.full_like(logprobs, float("nan")))
    poisoned_adv = torch.where(mask, adv, torch.full_like(adv, float("inf")))
    loss, grad = loss_and_grad(poisoned_lp, poisoned_adv)
    assert torch.equal(loss, base_loss)
    assert torch.equal(grad, base_grad)
    assert torch.all(grad[~mask] == 0)


def test_log_ratio_is_clamped_for_numerical_safety():
    loss, _ = ppo_clip(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), 0.2, 0.2)
    assert torch.isfinite(loss).all()


def test_positive_nll_hand_computed_and_zero_gradient_for_incorrect():
    # correct rows 0 (2 tokens) and 2 (1 token): NLL = −(−1 − 2 − 3)/3 = 2
    logprobs = torch.tensor([[-1.0, -2.0], [-5.0, -5.0], [-3.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    correct = torch.tensor([True, False, True])
    nll = positive_example_nll(logprobs, mask, correct)
    assert nll.item() == pytest.approx(2.0)
    nll.backward()
    assert torch.all(logprobs.grad[1] == 0)  # VAPO (f): incorrect sequences get exactly zero gradient
    torch.testing.assert_close(logprobs.grad[0], torch.full((2,), -1 / 3))


def test_positive_nll_is_zero_without_correct_sequences():
    nll = positive_example_nll(torch.full((2, 3), -4.0), torch.ones(2, 3), torch.tensor([False, False]))
    assert nll.item() == 0.0


def test_nll_weight_scales_only_that_term():
    # VAPO (f): actor loss = policy + μ·NLL; μ scales the NLL gradient linearly, μ = 0 leaves the
    # clip-higher token-mean PPO loss
    g = torch.Generator().manual_seed(2)
    logprobs = (-torch.rand(4, 6, generator=g)).requires_grad_(True)
    old = logprobs.detach() + 0.05 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    correct = torch.tensor([True, False, True, False])

    def grads(mu):
        per_token, _ = ppo_clip(logprobs, old, adv, mask, 0.2, 0.28)
        loss = aggregate(per_token, mask, "token-mean") + mu * positive_example_nll(logprobs, mask, correct)
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss.detach(), grad

    loss0, g0 = grads(0.0)
    per_token, _ = ppo_clip(logprobs, old, adv, mask, 0.2, 0.28)
    assert torch.equal(loss0, aggregate(per_token, mask, "token-mean").detach())
    _, g1 = grads(0.1)
    _, g2 = grads(0.2)
    torch.testing.assert_close(g2 - g0, 2 * (g1 - g0))
    assert torch.equal((g1 - g0)[~correct], torch.zeros(2, 6))


def approx_kl(old_probs, new_probs, tokens):
    """ppo_clip's approx_kl for sampled ``tokens`` of a categorical π_old, π_θ (one row, all tokens valid)."""
    logprobs, old_logprobs = torch.log(new_probs)[tokens][None], torch.log(old_probs)[tokens][None]
    _, stats = ppo_clip(logprobs, old_logprobs, torch.zeros_like(logprobs), torch.ones_like(logprobs), 0.2, 0.2)
    return stats["approx_kl"].item()


def test_approx_kl_is_k3_of_kl_old_to_new_hand_computed():
    # one token with ρ = π_θ/π_old = 2, r = ln 2: k3 = ρ − 1 − r = 1 − ln 2 (the old formula exp(−r) + r − 1
    # gave ln 2 − 1/2); a masked token with ρ = 100 does not count
    logprobs = torch.tensor([[math.log(2.0), math.log(100.0)]])
    _, stats = ppo_clip(logprobs, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 0.2, 0.2)
    assert stats["approx_kl"].item() == pytest.approx(1 - math.log(2))
    # π_old = (1/2, 1/4, 1/4), π_θ = (1/4, 1/4, 1/2): tokens in π_old's proportions make the mean the exact
    # expectation E_{π_old}[k3] = [2(ln 2 − 1/2) + 0 + (1 − ln 2)] / 4 = ln 2 / 4 = KL(π_old ‖ π_θ)
    #   = ½·ln 2 + ¼·ln 1 + ¼·ln ½ = ln 2 / 4 ≈ 0.1733 (the old formula gave (3/2 − ln 2) / 4 ≈ 0.2017)
    old, new = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.25, 0.25, 0.5])
    assert approx_kl(old, new, torch.tensor([0, 0, 1, 2])) == pytest.approx(math.log(2) / 4)


def test_approx_kl_matches_the_exact_kl_on_samples_from_the_old_policy():
    old, new = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    exact = (old * (old / new).log()).sum().item()  # KL(π_old ‖ π_θ) = 0.3·ln(5/2) ≈ 0.2749
    assert exact == pytest.approx(0.3 * math.log(2.5))
    tokens = torch.multinomial(old, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    # standard error ≈ 0.0005; the old formula's expectation was 0.355
    assert approx_kl(old, new, tokens) == pytest.approx(exact, abs=0.003)
