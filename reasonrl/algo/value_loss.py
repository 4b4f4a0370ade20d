"""Critic loss (verl's clipped value loss) and its diagnostics (explained variance, VC-PPO / VAPO)."""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algo.aggregate import AggregationMode, aggregate
from reasonrl.algo.masked import masked_mean, masked_var


def value_loss(
    values: Tensor,  # [B, T] V_new(s_t)
    old_values: Tensor,  # [B, T] V at rollout time
    returns: Tensor,  # [B, T] regression targets G_t
    loss_mask: Tensor,  # [B, T]
    clip: float | None,
    mode: AggregationMode,
    *,
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss: L_V = ½·agg(max((V − G)², (clip(V, V_old ± ε_v) − G)²)).

    verl's ``compute_value_loss`` (ε_v = 0.5 default); the Seed papers give no clip value
    (docs/algorithms.md, ambiguity 10: kept, ε_v = 0.5).  ``clip=None`` gives the plain ½·agg((V − G)²).
    Aggregation and global denominators as in ``aggregate``.  Returns (loss [], stats) with
    stats: clip_frac (the clipped branch is the larger one), value_mean, return_mean.
    A token outside ``loss_mask`` (e.g. of a truncated T-PPO sequence) gets exactly zero gradient.
    """
    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    values = torch.where(mask, values, zero)
    returns = torch.where(mask, returns.to(values.dtype), zero)
    squared_error = (values - returns) ** 2  # [B, T]
    if clip is None:
        per_token = 0.5 * squared_error
        clipped_larger = torch.zeros_like(mask)
    else:
        old = torch.where(mask, old_values.to(values.dtype), zero)
        clipped_values = old + (values - old).clamp(-clip, clip)
        clipped_error = (clipped_values - returns) ** 2
        per_token = 0.5 * torch.maximum(squared_error, clipped_error)
        clipped_larger = clipped_error > squared_error
    loss = aggregate(per_token, mask, mode, global_tokens, global_seqs, constant)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean(clipped_larger.float(), mask),
            "value_mean": masked_mean(values, mask),
            "return_mean": masked_mean(returns, mask),
        }
    return loss, stats


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """EV = 1 − Var(G − V) / Var(G) over masked-in tokens (VC-PPO / VAPO value-pretraining criterion).

    1 is a perfect critic, 0 is no better than a constant, negative is worse.  NaN when the
    returns have no variance (EV is undefined then).  values, returns, mask: [B, T] -> [].
    """
    var_returns = masked_var(returns, mask)
    ev = 1.0 - masked_var(returns - values, mask) / var_returns.clamp(min=1e-12)
    return torch.where(var_returns > 1e-12, ev, torch.full_like(ev, float("nan")))
