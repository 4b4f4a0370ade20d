"""Offline objectives: DPO, and DQO's soft Q-learning with the language model as its Q-function.

Pure torch; shapes in comments.  ``[B, T]`` tensors run over response tokens (``mask`` marks the real
ones, right-padded); a per-token log-ratio is ``log π_θ(a_h|s_h) − log π_ref(a_h|s_h)``.

DPO (Rafailov et al. 2023, arXiv 2305.18290, eq. 7) is a bandit method: one implicit reward per
response.  DQO (Liu et al. 2024, arXiv 2410.09302) treats generation as a token-level MDP with the
KL-regularised objective ``Σ_h r_h − β·log(π/π_ref)``, parameterises the soft Q-function by the policy,
``Q_θ(s_h, a_h) = β·log(π_θ/π_ref)(a_h|s_h) + V_φ(s_h)`` (Eq. 9), and fits Q_θ and V_φ to one shared
λ-return of the soft step rewards (Eqs. 12–16), importance-weighted from the behaviour policy that
sampled the data to the current one (§3.3).  The paper's open points, and what reasonrl chose for each,
are listed in docs/algorithms.md (DQO).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def dpo_losses(
    policy_chosen: Tensor,  # [N] Σ_t log π_θ(y_w)
    policy_rejected: Tensor,  # [N] Σ_t log π_θ(y_l)
    reference_chosen: Tensor,  # [N] Σ_t log π_ref(y_w)
    reference_rejected: Tensor,  # [N] Σ_t log π_ref(y_l)
    beta: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """DPO's per-pair loss −log σ(r_w − r_l) with implicit rewards r = β·log(π_θ/π_ref)(y) (arXiv 2305.18290, eq. 7).

    Returns (loss [N], r_w [N], r_l [N]); the loss of a batch is the mean over its pairs (the caller
    divides by the pair count of the whole mini-batch, so micro-batching leaves the gradient unchanged).
    """
    reward_chosen = beta * (policy_chosen - reference_chosen)
    reward_rejected = beta * (policy_rejected - reference_rejected)
    return -F.logsigmoid(reward_chosen - reward_rejected), reward_chosen, reward_rejected


def soft_q(logratio: Tensor, values: Tensor, beta: float) -> Tensor:
    """Q_θ(s_h, a_h) = β·log(π_θ/π_ref)(a_h|s_h) + V_φ(s_h) (DQO, Eq. 9): [B, T], [B, T] -> [B, T]."""
    return beta * logratio + values


def dqo_targets(
    rewards: Tensor,  # [B, T] r_h: the outcome on the last token, process rewards where given
    logratio: Tensor,  # [B, T] log(π_θ/π_ref)(a_h|s_h), no gradient
    values: Tensor,  # [B, T] V_φ(s_h), no gradient
    mask: Tensor,  # [B, T] bool
    beta: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """The λ-return G and the Q target y of every step (DQO, Eqs. 12–16).

    soft step reward  r~_h = r_h − β·log(π_θ/π_ref)(a_h|s_h)
    λ-return          G(s_h) = r~_h + (1−λ)·V(s_{h+1}) + λ·G(s_{h+1}),   G and V after the last token = 0
    Q target          y_h = r_h + (1−λ)·V(s_{h+1}) + λ·G(s_{h+1})  (= G(s_h) + β·log(π_θ/π_ref)(a_h|s_h))

    λ = 1 makes G the Monte-Carlo soft return of the remaining steps (the paper's preferred setting).
    Returns (G [B, T], y [B, T]), 0 where masked.
    """
    mask = mask.bool()
    soft = (rewards - beta * logratio) * mask  # [B, T]
    returns = torch.zeros_like(soft)
    next_return = torch.zeros_like(soft[:, 0])  # [B]
    next_value = torch.zeros_like(soft[:, 0])
    for h in reversed(range(soft.shape[1])):
        live = mask[:, h]
        step = soft[:, h] + (1.0 - lam) * next_value + lam * next_return
        returns[:, h] = torch.where(live, step, torch.zeros_like(step))
        next_return = torch.where(live, returns[:, h], next_return)
        next_value = torch.where(live, values[:, h], next_value)
    targets = (returns + beta * logratio) * mask
    return returns, targets


def importance_weights(
    logprobs: Tensor,  # [B, T] log π_θ(a_h|s_h), no gradient
    behaviour_logprobs: Tensor,  # [B, T] log μ(a_h|s_h) of the policy that sampled the data
    mask: Tensor,  # [B, T] bool
    clip: float | None,
) -> tuple[Tensor, Tensor]:
    """Per-decision importance weights from the behaviour policy μ to π_θ over the steps a target reads (DQO §3.3).

    The Q target of (s_h, a_h) sums the soft rewards of the steps after h, sampled by μ:
    w^Q_h = Π_{k>h} π_θ/μ(a_k|s_k).  The V target of s_h also reads a_h: w^V_h = Π_{k≥h} π_θ/μ.
    Weighted regression onto a target with these weights fits its expectation under π_θ.  Each weight
    is capped at ``clip`` (None: uncapped) against the variance of long products.
    Returns (w^Q [B, T], w^V [B, T]), 0 where masked.
    """
    mask = mask.bool()
    log_ratio = (logprobs - behaviour_logprobs) * mask  # [B, T]
    from_here = log_ratio.flip(1).cumsum(1).flip(1)  # [B, T] Σ_{k≥h}
    weights_v, weights_q = from_here.exp(), (from_here - log_ratio).exp()
    if clip is not None:
        weights_v, weights_q = weights_v.clamp(max=clip), weights_q.clamp(max=clip)
    return weights_q * mask, weights_v * mask


def dqo_policy_loss(
    logratio: Tensor,  # [B, T] log(π_θ/π_ref), with gradient
    values: Tensor,  # [B, T] V_φ(s_h), no gradient
    targets: Tensor,  # [B, T] y_h
    weights: Tensor,  # [B, T] w^Q_h
    mask: Tensor,  # [B, T] bool
    beta: float,
    global_tokens: int | Tensor,
) -> Tensor:
    """L_Q(θ) = Σ_h w_h·(Q_θ(s_h, a_h) − y_h)² / tokens (DQO, Eq. 11), V_φ held fixed: -> [].

    ``global_tokens`` counts the whole mini-batch's tokens, so micro-batches sum to the mini-batch loss.
    """
    errors = soft_q(logratio, values, beta) - targets
    return (weights * errors.square() * mask).sum() / max(1, int(global_tokens))


def dqo_value_loss(
    values: Tensor,  # [B, T] V_φ(s_h), with gradient
    returns: Tensor,  # [B, T] G(s_h)
    weights: Tensor,  # [B, T] w^V_h
    mask: Tensor,  # [B, T] bool
    global_tokens: int | Tensor,
) -> Tensor:
    """L_V(φ) = Σ_h w_h·(V_φ(s_h) − G(s_h))² / tokens (DQO, Eq. 10): -> []."""
    return (weights * (values - returns).square() * mask).sum() / max(1, int(global_tokens))
