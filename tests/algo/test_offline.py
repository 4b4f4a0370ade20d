"""DPO's loss and DQO's soft-Q machinery: hand-computed values, the theory-level properties, and a
2-step MDP on which minimising DQO's losses reaches the analytic soft-optimal policy."""

import math

import pytest
import torch

from reasonrl.algo.offline_objectives import (
    dpo_losses,
    dqo_policy_loss,
    dqo_targets,
    dqo_value_loss,
    importance_weights,
    soft_q,
)


def test_dpo_loss_by_hand():
    loss, chosen, rejected = dpo_losses(
        torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), beta=0.1
    )
    assert chosen.item() == pytest.approx(0.05) and rejected.item() == pytest.approx(-0.05)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.1)))


def test_dpo_loss_is_log2_at_the_reference_and_falls_as_the_margin_grows():
    ref = torch.tensor([-3.0, -7.0])
    at_reference, _, _ = dpo_losses(ref, ref, ref, ref, beta=0.5)
    assert torch.allclose(at_reference, torch.full((2,), math.log(2.0)))
    better, _, _ = dpo_losses(ref + 1.0, ref - 1.0, ref, ref, beta=0.5)
    assert (better < at_reference).all()


def test_q_equals_v_when_the_policy_is_the_reference():
    values = torch.randn(3, 5)
    logp = torch.randn(3, 5)
    assert torch.equal(soft_q(logp - logp, values, beta=0.3), values)


def test_targets_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    logratio = torch.tensor([[0.2, -0.4, 0.0]])
    values = torch.tensor([[0.5, 0.3, 9.0]])  # the masked 9 must not leak in: the state after the end is terminal
    mask = torch.tensor([[True, True, False]])
    returns, targets = dqo_targets(rewards, logratio, values, mask, beta=0.5, lam=0.5)
    assert returns[0].tolist() == pytest.approx([0.65, 1.2, 0.0])
    assert targets[0].tolist() == pytest.approx([0.75, 1.0, 0.0])


def test_lambda_one_gives_the_remaining_soft_return_and_y_minus_the_log_ratio_is_g():
    torch.manual_seed(0)
    rewards, logratio, values = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    mask = torch.arange(6)[None, :] < torch.tensor([6, 4, 1, 3])[:, None]
    beta = 0.7
    returns, _ = dqo_targets(rewards, logratio, values, mask, beta, lam=1.0)
    soft = (rewards - beta * logratio) * mask
    assert torch.allclose(returns, soft.flip(1).cumsum(1).flip(1) * mask, atol=1e-6)
    for lam in (0.0, 0.5, 0.95, 1.0):
        returns, targets = dqo_targets(rewards, logratio, values, mask, beta, lam)
        assert torch.allclose(targets - beta * logratio * mask, returns, atol=1e-6)
        # y_h = r_h + (1−λ)·V(s_{h+1}) + λ·G(s_{h+1}) inside the response
        inner = mask[:, 1:]
        expected = rewards[:, :-1] + (1 - lam) * values[:, 1:] + lam * returns[:, 1:]
        assert torch.allclose(targets[:, :-1][inner], expected[inner], atol=1e-6)


def test_the_augmented_reward_convention_gives_identical_losses():
    """r̄ = r + β·log π_ref with Q̄ = β·log π_θ + V (the paper's reward convention) is the log-ratio
    convention's model shifted by β·log π_ref on both sides of every regression."""
    torch.manual_seed(1)
    beta, lam = 0.4, 0.8
    logp, ref, behaviour = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 2, 4])[:, None]
    returns, targets = dqo_targets(rewards, logp - ref, values, mask, beta, lam)
    w_q, w_v = importance_weights(logp, behaviour, mask, clip=2.0)
    tokens = int(mask.sum())
    q_loss = dqo_policy_loss(logp - ref, values, targets, w_q, mask, beta, tokens)
    v_loss = dqo_value_loss(values, returns, w_v, mask, tokens)
    # the augmented convention, written out: its soft reward r̄ − β·log π_θ is the same r~, so G agrees
    augmented_rewards = rewards + beta * ref
    returns_bar, y_bar = dqo_targets(augmented_rewards, logp, values, mask, beta, lam)  # ȳ = r̄ + (1−λ)V' + λG'
    q_bar = beta * logp + values  # Q̄_θ
    assert torch.allclose(returns_bar, returns, atol=1e-6)
    q_bar_loss = (w_q * (q_bar - y_bar).square() * mask).sum() / tokens
    assert q_bar_loss.item() == pytest.approx(q_loss.item(), rel=1e-5)
    assert dqo_value_loss(values, returns_bar, w_v, mask, tokens).item() == pytest.approx(v_loss.item(), rel=1e-5)


def test_importance_weights_by_hand():
    logp = torch.tensor([[-1.0, -2.0]])
    behaviour = torch.tensor([[-1.5, -1.5]])
    mask = torch.tensor([[True, True]])
    w_q, w_v = importance_weights(logp, behaviour, mask, clip=None)
    assert w_v[0].tolist() == pytest.approx([1.0, math.exp(-0.5)])
    assert w_q[0].tolist() == pytest.approx([math.exp(-0.5), 1.0])
    w_q, w_v = importance_weights(logp, behaviour, mask, clip=0.8)
    assert w_v[0].tolist() == pytest.approx([0.8, math.exp(-0.5)])
    assert w_q[0].tolist() == pytest.approx([math.exp(-0.5), 0.8])


# --- a 2-step MDP: the soft-optimal policy is known in closed form --------------------------------

A = 3  # actions per step; the state of step 1 is the first action


def _soft_optimal(ref0, ref1, r0, r1, beta):
    """π* ∝ π_ref·exp(Q*/β) by the soft Bellman equations, backwards from the terminal step."""
    v1 = beta * torch.logsumexp(ref1.log() + r1 / beta, dim=1)  # [A] V*(s1)
    q0 = r0 + v1  # [A]
    v0 = beta * torch.logsumexp(ref0.log() + q0 / beta, dim=0)
    return ref0 * ((q0 - v0) / beta).exp(), ref1 * ((r1 - v1[:, None]) / beta).exp()


def _fit_dqo(ref0, ref1, mu0, mu1, r0, r1, beta, lam, weighted, iterations=1500):
    """Minimise DQO's losses in expectation over every trajectory of the behaviour policy μ (exactly)."""
    a0, a1 = torch.meshgrid(torch.arange(A), torch.arange(A), indexing="ij")
    a0, a1 = a0.reshape(-1), a1.reshape(-1)  # the 9 trajectories
    probability = mu0[a0] * mu1[a0, a1]  # [9] how often μ samples each
    rewards = torch.stack([r0[a0], r1[a0, a1]], dim=1)  # [9, 2]
    ref_logp = torch.stack([ref0.log()[a0], ref1.log()[a0, a1]], dim=1)
    behaviour = torch.stack([mu0.log()[a0], mu1.log()[a0, a1]], dim=1)
    mask = torch.ones(9, 2, dtype=torch.bool)
    logits0 = ref0.log().clone().requires_grad_()
    logits1 = ref1.log().clone().requires_grad_()
    v0 = torch.zeros((), dtype=torch.float64, requires_grad=True)
    v1 = torch.zeros(A, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.Adam([logits0, logits1, v0, v1], lr=0.05)
    for _ in range(iterations):
        logp = torch.stack([logits0.log_softmax(0)[a0], logits1.log_softmax(1)[a0, a1]], dim=1)
        values = torch.stack([v0.expand(9), v1[a0]], dim=1)
        logratio = logp - ref_logp
        returns, targets = dqo_targets(rewards, logratio.detach(), values.detach(), mask, beta, lam)
        if weighted:
            w_q, w_v = importance_weights(logp.detach(), behaviour, mask, clip=None)
        else:
            w_q = w_v = torch.ones_like(logp)
        w_q, w_v = w_q * probability[:, None], w_v * probability[:, None]
        loss = dqo_policy_loss(logratio, values.detach(), targets, w_q, mask, beta, 1) + dqo_value_loss(
            values, returns, w_v, mask, 1
        )
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return logits0.detach().softmax(0), logits1.detach().softmax(1)


def _kl(p, q):
    return (p * (p.log() - q.log())).sum(-1)


@pytest.mark.parametrize(("lam", "weighted"), [(1.0, True), (0.5, True), (1.0, False)])
def test_minimising_dqo_reaches_the_soft_optimal_policy_from_off_policy_data(lam, weighted):
    torch.manual_seed(0)
    dtype = torch.float64
    ref0, ref1 = torch.rand(A, dtype=dtype).softmax(0), torch.rand(A, A, dtype=dtype).mul(2).softmax(1)
    mu0, mu1 = torch.rand(A, dtype=dtype).mul(2).softmax(0), torch.rand(A, A, dtype=dtype).softmax(1)  # ≠ π_ref
    r0, r1 = torch.randn(A, dtype=dtype) * 0.5, torch.randn(A, A, dtype=dtype)
    beta = 0.5
    optimal0, optimal1 = _soft_optimal(ref0, ref1, r0, r1, beta)
    assert _kl(optimal0, ref0) > 0.05  # the optimum is far from the reference: the test can fail
    # Without the weights the exact fit lands there too: at the optimum the soft consistency
    # β·log(π*/π_ref)(a|s) = r + V*(s') − V*(s) holds for every action (path consistency), so the
    # targets do not depend on which policy sampled the data.  The weights matter when a model cannot
    # fit every state exactly; the benchmark measures that (bench/fidelity_offline.py).
    pi0, pi1 = _fit_dqo(ref0, ref1, mu0, mu1, r0, r1, beta, lam, weighted)
    assert _kl(optimal0, pi0).item() < 1e-3
    assert _kl(optimal1, pi1).max().item() < 1e-3
