"""Off-policy corrections: reweight or mask each token's policy loss by π_prox / π_behav.

Three policies meet at every token (docs/algorithms.md, "Off-policy corrections"): the behaviour
policy π_behav that sampled it (the rollout engine, possibly some policy versions behind, in its own
numerics: ``rollout_logprobs``), the proximal policy π_prox (the trainer's own log-prob pass at the
current version before the update: ``old_logprobs``, the centre of the PPO clip) and π_θ, being trained.
PPO's ratio π_θ / π_prox bounds the update; the weight w = π_prox / π_behav, treated as data
(no gradient), corrects for the tokens having been drawn from π_behav instead of π_prox.
With π_prox = π_behav (synchronous, on-policy, same numerics) every mode leaves the loss unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reasonrl.algo.masked import masked_mean, masked_sum
from reasonrl.algo.policy_loss import LOG_RATIO_LIMIT

CORRECTION_MODES = ("none", "decoupled", "tis", "mis")
CORRECTION_LEVELS = ("token", "sequence")


def behaviour_log_ratio(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log r_t = log π_prox(a_t|s_t) − log π_behav(a_t|s_t), [B, T] (all three arguments [B, T]).

    Clamped to ±LOG_RATIO_LIMIT (numerical guard, as in ``ppo_clip``); 0 where mask is False, whatever
    the inputs hold there (NaN included).
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=proximal_logprobs.dtype, device=proximal_logprobs.device)
    return torch.where(mask, proximal_logprobs - behaviour_logprobs, zero).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def importance_weights(
    log_ratio: Tensor,  # [B, T] log π_prox − log π_behav (``behaviour_log_ratio``)
    mask: Tensor,  # [B, T] the tokens the policy loss reads
    mode: str,
    level: str,
    threshold: float,
) -> tuple[Tensor, Tensor]:
    """(weights [B, T] float, keep [B, T] bool): multiply each token's policy loss by weights, train only where keep.

    With r the token's ratio exp(log r_t) (level "token") or its row's exp(Σ_t log r_t) over the mask
    (level "sequence", broadcast to the row's tokens) and C = threshold > 1:
    - none: w = 1, keep = mask.
    - decoupled (AReaL, Fu et al. 2025, arXiv:2505.24298, the decoupled PPO objective
      J = E_{π_behav}[Σ_t (π_prox/π_behav) · min(u_t A_t, clip(u_t, 1−ε, 1+ε) A_t)], u_t = π_θ/π_prox):
      w = r, tokens with r > C dropped (AReaL's ``behav_imp_weight_cap``).  Token level only.
    - tis (truncated importance sampling; Yao et al. 2025, "Your efficient RL framework secretly brings
      you off-policy RL training"; verl's rollout correction): w = min(r, C), keep = mask.
    - mis (masked importance sampling, verl's rollout rejection sampling): keep where 1/C ≤ r ≤ C,
      w = 1 there (no reweighting); at the sequence level a row is kept or dropped whole.
    w = 0 wherever keep is False.  The weights carry no gradient.  Comparisons run in log space
    (log r ≤ log C), so a long row's summed log-ratio cannot overflow.
    """
    _check_settings(mode, level, threshold)
    mask = mask.bool()
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    log_ratio = torch.where(mask, log_ratio.detach(), zero)
    if level == "sequence":
        log_ratio = masked_sum(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio)  # [B, T]
    log_cap = math.log(threshold)
    keep, weights = mask, torch.ones_like(log_ratio)  # none
    if mode == "decoupled":
        keep, weights = mask & (log_ratio <= log_cap), torch.exp(log_ratio)
    elif mode == "tis":
        weights = torch.exp(log_ratio.clamp(max=log_cap))
    elif mode == "mis":
        keep = mask & (log_ratio.abs() <= log_cap)
    return torch.where(keep, weights, zero), keep


def correction_stats(log_ratio: Tensor, weights: Tensor, keep: Tensor, mask: Tensor) -> dict[str, float]:
    """Diagnostics of one correction over the mask's tokens (all arguments [B, T]), as Python floats.

    rollout/is_weight_mean, rollout/is_weight_max: of ρ_t = exp(log r_t) before truncation or masking
    (1.0 for an empty mask).  rollout/is_truncated_fraction: kept tokens whose weight is below their
    ρ_t; a weight of exactly 1 (none, mis: no reweighting) never counts, so only tis truncations do (at
    the sequence level: the tokens whose own ρ_t exceeds their row's truncated weight).
    rollout/is_masked_fraction: tokens with keep False.  rollout/trainer_kl: KL(π_behav ‖ π_prox) =
    E_{a∼π_behav}[−log r] estimated from the sampled tokens with Schulman's k3 (2020), mean of
    ρ − 1 − log ρ ≥ 0 (as ``ppo_clip``'s approx_kl).
    """
    mask = mask.bool()
    with torch.no_grad():
        log_ratio = torch.where(mask, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device))
        ratio = torch.exp(log_ratio)
        truncated = keep & (weights < ratio) & (weights != 1.0)
        return {
            "rollout/is_weight_mean": masked_mean(ratio, mask).item() if mask.any() else 1.0,
            "rollout/is_weight_max": ratio[mask].max().item() if mask.any() else 1.0,
            "rollout/is_truncated_fraction": masked_mean(truncated.float(), mask).item(),
            "rollout/is_masked_fraction": masked_mean((~keep).float(), mask).item(),
            "rollout/trainer_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask).item(),
        }


def _check_settings(mode: str, level: str, threshold: float) -> None:
    """ValueError naming the setting for a mode, level or threshold the corrections do not define."""
    if mode not in CORRECTION_MODES:
        raise ValueError(f"algo.rollout_correction must be one of {CORRECTION_MODES}, got {mode!r}")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"algo.rollout_correction_level must be one of {CORRECTION_LEVELS}, got {level!r}")
    if mode == "decoupled" and level != "token":
        raise ValueError(
            "algo.rollout_correction='decoupled' weights each token (AReaL's decoupled PPO objective): "
            f"set algo.rollout_correction_level='token', not {level!r}"
        )
    if not threshold > 1.0:
        raise ValueError(f"algo.rollout_correction_threshold must be > 1, got {threshold}")
