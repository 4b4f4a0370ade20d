"""Masked reductions shared by the estimators and the losses.

Masked positions are excluded with ``torch.where`` rather than multiplication, so a NaN or inf
stored at a masked position can neither reach a result nor its gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum of x over positions where mask is true.  x, mask: same shape."""
    zeros = torch.zeros((), dtype=x.dtype, device=x.device)
    kept = torch.where(mask.bool(), x, zeros)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """mean of x over masked-in positions; 0 where nothing is masked in."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of x over all masked-in positions (a scalar); N-1 denominator when unbiased."""
    mean = masked_mean(x, mask)
    count = mask.bool().sum()
    sq = masked_sum((x - mean) ** 2, mask)
    return sq / (count - 1 if unbiased else count).clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the masked-in positions; masked positions become 0.

    Matches verl's ``masked_whiten`` (unbiased variance, eps 1e-8) used after GAE.
    x, mask: [B, T] -> [B, T]
    """
    mask = mask.bool()
    whitened = (x - masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + eps)
    return torch.where(mask, whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def role_whiten(x: Tensor, role_ids: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Whiten x separately over the tokens of each role (PAG RoleAdvNorm, arXiv 2506.10406 §3).

    Every role's masked-in tokens end with mean 0 and unbiased std 1 (up to eps).  Statistics are
    taken over the whole tensor passed in, so call it on the full rollout batch, before splitting
    into mini-batches (PAG ambiguity (e)4).
    x, role_ids, mask: [B, T] -> [B, T]; masked positions become 0.
    """
    mask = mask.bool()
    out = torch.zeros_like(x)
    for role in torch.unique(role_ids[mask]):
        in_role = mask & (role_ids == role)
        out = torch.where(in_role, masked_whiten(x, in_role, eps), out)
    return out
