"""KL estimators (Schulman 2020) and coefficient controllers (Ziegler et al. 2019)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLKind = Literal["k1", "k2", "k3"]
KL_LOG_RATIO_LIMIT = 20.0
K3_LIMIT = 10.0


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from the sampled token, d = log π_θ − log π_ref.

    k1 = d (unbiased, can be negative);  k2 = ½ d² (its gradient is the true KL's);
    k3 = exp(−d) + d − 1 (≥ 0, low variance; Schulman 2020, GRPO eq 4).
    As verl, k3 clamps d to ±20 and the result to [−10, 10].  [B, T] -> [B, T].
    """
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        d = d.clamp(-KL_LOG_RATIO_LIMIT, KL_LOG_RATIO_LIMIT)
        return (torch.exp(-d) + d - 1.0).clamp(-K3_LIMIT, K3_LIMIT)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


def kl_penalized_rewards(token_rewards: Tensor, kl: Tensor, coef: float | Tensor, response_mask: Tensor) -> Tensor:
    """KL in the reward (InstructGPT): r_t − β·kl_t on every valid response token.  [B, T] -> [B, T]."""
    penalized = token_rewards - coef * kl
    return torch.where(response_mask.bool(), penalized, torch.zeros_like(penalized))


class FixedKLController:
    """A constant KL coefficient β."""

    def __init__(self, coef: float) -> None:
        self.coef: float | Tensor = coef

    def update(self, observed_kl: float | Tensor, n_steps: int) -> None:
        """A fixed coefficient ignores the observed KL."""


class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019; verl): β ← β·(1 + clip(KL/target − 1, ±0.2)·n_steps/horizon).

    β grows while the observed KL is above target and shrinks below it, by at most 20% of
    n_steps/horizon per update.  ``coef`` becomes a tensor once updated with a tensor (no host sync).
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        self.coef: float | Tensor = init_coef
        self.target = target
        self.horizon = horizon

    def update(self, observed_kl: float | Tensor, n_steps: int) -> None:
        """Move β towards the KL target after ``n_steps`` samples (or steps) with mean KL ``observed_kl``."""
        error = torch.clamp(torch.as_tensor(observed_kl) / self.target - 1.0, -0.2, 0.2)
        self.coef = self.coef * (1.0 + error * n_steps / self.horizon)
