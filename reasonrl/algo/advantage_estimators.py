"""Advantage estimators: GAE and its Seed-family variants, and the critic-free group estimators.

Conventions (docs/algorithms.md, Conventions 1–3): tensors are [B, T] over *response* tokens only; ``values[:, t]`` is
V(s_t), the critic's estimate before emitting token t; the state after the last valid token is
terminal (V := 0) unless a bootstrap value is given (EGAE).  At masked positions the returned
advantages and returns are 0.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from reasonrl.algo.masked import masked_whiten

MaskMode = Literal["skip", "reset"]


def _per_sequence(lam: float | Tensor, batch: int, like: Tensor) -> Tensor:
    """Broadcast a float or [B] tensor λ to a [B] tensor of like's dtype and device."""
    return torch.as_tensor(lam, dtype=like.dtype, device=like.device).expand(batch)


def _gae_scan(
    token_rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T]
    response_mask: Tensor,  # [B, T]
    gamma: float,
    lam: float | Tensor,  # float or [B]
    mask_mode: MaskMode,
    bootstrap: Tensor,  # [B] value of the state after the last valid token
) -> tuple[Tensor, Tensor]:
    """The backward GAE recursion shared by ``gae`` and ``egae`` (one loop over T, vectorised over B)."""
    if mask_mode not in ("skip", "reset"):
        raise ValueError(f"mask_mode must be 'skip' or 'reset', got {mask_mode!r}")
    batch, length = token_rewards.shape
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    rewards = torch.where(mask, token_rewards.to(values.dtype), zero)  # [B, T]
    vals = torch.where(mask, values, zero)  # [B, T]
    gamma_lam = gamma * _per_sequence(lam, batch, values)  # [B]
    # positions after the last valid token: there the "next state" is the episode end
    trailing = mask.flip(1).cumsum(1).flip(1) == 0  # [B, T]

    bootstrap = bootstrap.to(values.dtype)  # [B]
    next_value = bootstrap  # [B]
    running = torch.zeros(batch, dtype=values.dtype, device=values.device)  # [B]
    advantages = torch.zeros_like(vals)  # [B, T]
    for t in range(length - 1, -1, -1):
        valid, after_end = mask[:, t], trailing[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]  # [B]
        step_adv = delta + gamma_lam * running  # [B]
        if mask_mode == "skip":  # carry value and running advantage through the gap
            gap_value, gap_adv = next_value, running
        else:  # reset: the token before a gap ends its own episode
            gap_value, gap_adv = torch.zeros_like(next_value), torch.zeros_like(running)
        next_value = torch.where(valid, vals[:, t], torch.where(after_end, bootstrap, gap_value))
        running = torch.where(valid, step_adv, torch.where(after_end, torch.zeros_like(running), gap_adv))
        advantages[:, t] = torch.where(valid, step_adv, zero)
    returns = torch.where(mask, advantages + vals, zero)
    return advantages, returns


def gae(
    token_rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T]  V(s_t)
    response_mask: Tensor,  # [B, T]
    gamma: float,
    lam: float | Tensor,  # float or [B]
    *,
    mask_mode: MaskMode = "skip",
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation; returns (advantages [B, T], returns [B, T]).

    δ_t = r_t + γ V(s_{t+1}) − V(s_t),  A_t = δ_t + γ λ A_{t+1},  G_t = A_t + V(s_t)
    (Schulman et al. 2015; DAPO eqs 2–3; VAPO eq 3).  λ may differ per sequence (a [B] tensor, as
    length-adaptive GAE needs).  No whitening happens here.

    Masked positions inside a sequence follow ``mask_mode`` (docs/algorithms.md, ambiguity 7):
      - ``skip`` (verl): value and running advantage are carried through the gap, so credit flows
        across it as if those tokens were absent;
      - ``reset`` (PAG turn-independent GAE): the token before a gap sees V(next) = 0 and a fresh
        running advantage, so every contiguous segment is its own episode.
    Advantages and returns are 0 at masked positions.
    """
    bootstrap = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    return _gae_scan(token_rewards, values, response_mask, gamma, lam, mask_mode, bootstrap)


def egae(
    token_rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T]
    response_mask: Tensor,  # [B, T]
    truncated: Tensor,  # [B] bool: the sequence is still running (no EOS yet)
    gamma: float,
    lam: float | Tensor,  # float or [B]
    *,
    mask_mode: MaskMode = "skip",
) -> tuple[Tensor, Tensor]:
    """Extended GAE for partial sequences (T-PPO, arXiv 2506.15050, eq 6 as quoted by reviewers).

    A_t = Σ_{k=0}^{l−t−1} (γλ)^k δ_{t+k}, with the bootstrap V(s_l) := V(s_{l−1}) for a sequence
    still running at length l; complete rows (truncated = False) go through exactly the same
    arithmetic as ``gae`` with bootstrap 0, so they equal ``gae`` bit for bit.
    With γ = 1 and no reward on the last token, a running sequence's last advantage is 0
    (docs/algorithms.md, ambiguity 8).  Returns (advantages [B, T], returns [B, T]).
    """
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # [B, T]
    last = torch.where(mask, positions, torch.zeros_like(positions)).amax(dim=1)  # [B]
    last_value = values.gather(1, last[:, None]).squeeze(1)  # [B]  V(s_{l-1})
    running = truncated.bool() & mask.any(dim=1)  # [B]
    bootstrap = torch.where(running, last_value, torch.zeros_like(last_value))  # [B]
    return _gae_scan(token_rewards, values, response_mask, gamma, lam, mask_mode, bootstrap)


def decoupled_gae(
    token_rewards: Tensor,  # [B, T]
    values: Tensor,  # [B, T]
    response_mask: Tensor,  # [B, T]
    gamma: float,
    lam_policy: float | Tensor,  # float or [B]
    lam_critic: float | Tensor,  # float or [B]
    *,
    mask_mode: MaskMode = "skip",
    running: Tensor | None = None,  # [B] bool: T-PPO sequences still generating
) -> tuple[Tensor, Tensor]:
    """Decoupled GAE (VC-PPO arXiv 2503.01491; VAPO arXiv 2504.05118 §4.1).

    A^π = GAE(λ_policy) feeds only the policy loss; G^V = GAE(λ_critic) + V feeds only the value
    loss.  The papers use λ_critic = 1 (Monte-Carlo targets).  With ``running`` both are EGAE
    (T-PPO): running rows bootstrap from V(s_{l−1}), finished rows are plain GAE.  Returns
    (policy_advantages [B, T], critic_returns [B, T]).
    """
    if running is None:
        running = torch.zeros(values.shape[0], dtype=torch.bool, device=values.device)
    policy_advantages, _ = egae(token_rewards, values, response_mask, running, gamma, lam_policy, mask_mode=mask_mode)
    _, critic_returns = egae(token_rewards, values, response_mask, running, gamma, lam_critic, mask_mode=mask_mode)
    return policy_advantages, critic_returns


def length_adaptive_lambda(lengths: Tensor, alpha: float, *, max_lambda: float = 0.9999) -> Tensor:
    """VAPO length-adaptive λ_policy (arXiv 2504.05118 eq 5): λ(l) = 1 − 1/(α·l).

    Chosen so the effective horizon 1/(1−λ) equals α·l.  lengths: [B] response lengths -> [B].
    Deviation: the paper is silent for l ≤ 1/α (λ ≤ 0); we clamp λ to [0, max_lambda] (docs/algorithms.md, ambiguity 6),
    so very short responses get one-step TD advantages (λ = 0).
    """
    lengths = lengths.to(torch.float64)
    lam = 1.0 - 1.0 / (alpha * lengths)  # [B]; -inf for l = 0
    return lam.clamp(min=0.0, max=max_lambda).to(torch.get_default_dtype())


def group_advantages(
    rewards: Tensor,  # [B]
    group_ids: Tensor,  # [B] any integer ids; equal id = same prompt
    norm_by_std: bool = True,
    eps: float = 1e-6,
    *,
    unbiased: bool = True,
) -> Tensor:
    """Group-normalised advantages (GRPO; DAPO eq 9): A_i = (R_i − mean_g R) / (std_g R + eps).

    ``norm_by_std=False`` gives Dr. GRPO's A_i = R_i − mean_g R.  The std is unbiased (N−1) by
    default, matching verl (docs/algorithms.md, ambiguity 1).  A singleton group gets mean 0 and std 1
    (verl), i.e. A = R.
    An all-equal group gets A = 0.  Returns [B]; broadcast to tokens with ``sequence_to_tokens``.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    rewards = rewards.to(torch.get_default_dtype()) if not rewards.is_floating_point() else rewards
    sums = torch.zeros(counts.numel(), dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    mean = sums / counts  # [G]
    squares = torch.zeros_like(mean).index_add_(0, inverse, (rewards - mean[inverse]) ** 2)  # [G]
    std = (squares / (counts - int(unbiased)).clamp(min=1)).sqrt()  # [G]
    singleton = counts[inverse] == 1  # [B]
    group_mean = torch.where(singleton, torch.zeros_like(rewards), mean[inverse])  # [B]
    group_std = torch.where(singleton, torch.ones_like(rewards), std[inverse])  # [B]
    advantages = rewards - group_mean
    return advantages / (group_std + eps) if norm_by_std else advantages


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): A_i = R_i − mean_{j≠i, j∈g(i)} R_j.

    rewards, group_ids: [B] -> [B].  A singleton group has no baseline: A = R (as verl).
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    rewards = rewards.to(torch.get_default_dtype()) if not rewards.is_floating_point() else rewards
    sums = torch.zeros(counts.numel(), dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    n = counts[inverse].to(rewards.dtype)  # [B]
    baseline = (sums[inverse] - rewards) / (n - 1).clamp(min=1)  # [B]
    return torch.where(n > 1, rewards - baseline, rewards)


def reinforce_pp_advantages(
    token_rewards: Tensor,  # [B, T]
    response_mask: Tensor,  # [B, T]
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): discounted reward-to-go, whitened over the batch.

    G_t = Σ_{k≥t} γ^{k−t} r_k (valid tokens only),  A = whiten(G) over all valid tokens.
    Returns (advantages [B, T], returns [B, T]).
    """
    returns = reward_to_go(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask), returns


def reward_to_go(
    token_rewards: Tensor,  # [B, T]
    response_mask: Tensor,  # [B, T]
    gamma: float,
) -> Tensor:
    """The Monte-Carlo return G_t = Σ_{k≥t} γ^{k−t} r_k over valid tokens: [B, T], 0 where masked.

    GAE with V ≡ 0 and λ = 1; with γ = 1 and an outcome reward R, G_t = R at every token.
    """
    zeros = torch.zeros_like(token_rewards, dtype=torch.get_default_dtype())
    returns, _ = gae(token_rewards, zeros, response_mask, gamma, 1.0)
    return returns


def sequence_to_tokens(per_sequence: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast a per-sequence value [B] to every valid token: [B] -> [B, T], 0 where masked."""
    expanded = per_sequence[:, None].expand(response_mask.shape)
    return torch.where(response_mask.bool(), expanded, torch.zeros_like(expanded))
