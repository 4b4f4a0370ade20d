"""Per-token policy surrogates and actor auxiliary terms.

Each function returns per-token losses (or a scalar for terms with a fixed aggregation) and a dict
of scalar tensor statistics; aggregation over tokens is ``aggregate``'s job.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algo.aggregate import aggregate
from reasonrl.algo.masked import masked_mean

LOG_RATIO_LIMIT = 20.0  # exp(±20) stays finite in fp32; numerical guard only (verl)


def ppo_clip(
    logprobs: Tensor,  # [B, T] log π_θ(a_t | s_t)
    old_logprobs: Tensor,  # [B, T] log π_old(a_t | s_t), behaviour policy
    advantages: Tensor,  # [B, T]
    loss_mask: Tensor,  # [B, T]
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with decoupled clip range and optional dual-clip.

    l_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t),  ρ_t = exp(logπ_θ − logπ_old)
    (PPO, Schulman et al. 2017; Clip-Higher, DAPO eq 10 with ε_low = 0.2, ε_high = 0.28).
    Dual-clip (Ye et al. 2019, verl): for A_t < 0 the loss is further capped at −c·A_t, c > 1.
    Not in any of the Seed papers: off (None) in faithful presets.

    Returns (per_token_loss [B, T], stats).  Masked positions get loss 0 and no gradient, whatever
    their inputs (NaN included).  The log-ratio is clamped to ±20 before exp (numerical guard).
    Stats (masked means): clip_frac_high (ρ > 1+ε_high with A > 0: the gradient is cut),
    clip_frac_low (ρ < 1−ε_low with A < 0), dual_clip_frac, ratio_mean, approx_kl.

    approx_kl estimates KL(π_old ‖ π_θ) = E_{a∼π_old}[−r], r = log ρ, from the sampled tokens (drawn
    from π_old), with Schulman's k3 (2020): adding the zero-mean control variate ρ − 1 gives
    k3 = ρ − 1 − r = exp(r) − 1 − r ≥ 0, unbiased and low-variance.
    """
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zero).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    adv = torch.where(mask, advantages.to(logprobs.dtype), zero)
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)  # [B, T]
    dual_applied = torch.zeros_like(mask)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_applied = (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    loss = torch.where(mask, loss, zero)
    with torch.no_grad():
        stats = {
            "clip_frac_high": masked_mean(((ratio > 1.0 + eps_high) & (adv > 0)).float(), mask),
            "clip_frac_low": masked_mean(((ratio < 1.0 - eps_low) & (adv < 0)).float(), mask),
            "dual_clip_frac": masked_mean(dual_applied.float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),  # k3 of KL(π_old ‖ π_θ)
        }
    return loss, stats


def positive_example_nll(
    logprobs: Tensor,  # [B, T]
    loss_mask: Tensor,  # [B, T]
    correct: Tensor,  # [B] bool: the verifier judged the final answer correct
    global_tokens: int | Tensor | None = None,
) -> Tensor:
    """VAPO positive-example LM loss (arXiv 2504.05118 eq 9), a scalar.

    L_NLL = −Σ_{o∈T} Σ_t log π_θ(a_t|s_t) / Σ_{o∈T} |o|,  T = correct responses of the mini-batch.
    A token-mean over the tokens of correct sequences only: incorrect sequences get exactly zero
    gradient.  ``global_tokens`` = valid tokens of correct sequences in the whole mini-batch (for
    micro-batch invariance).  No correct sequence -> 0 (docs/algorithms.md, ambiguity 17).  The weight μ is applied by
    the caller.
    """
    positive_mask = loss_mask.bool() & correct.bool()[:, None]  # [B, T]
    return aggregate(-logprobs, positive_mask, "token-mean", global_tokens=global_tokens)
