"""Mechanism diagnostics: per-batch measurements of what the value-based papers say they fix.

VC-PPO (arXiv 2503.01491, abstract) names two causes of PPO's failure on long responses: *value
initialisation bias* (a critic that mis-predicts the return of early tokens biases their
advantages) and *reward signal decay* (with λ < 1 an outcome reward reaches an early token's
advantage only through the factor (γλ)^k of GAE, VAPO eq 3).  VAPO eq 5 answers the decay with a λ
that grows with the response length.  These functions measure both on a rollout batch.

Tensors are [B, T] over response tokens (docs/algorithms.md, Conventions 1).  Positions are
counted among a row's valid tokens, so a row's "first 10%" is of its own length.  A statistic over
rows leaves out rows without a valid token, and is NaN when no row has one.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from reasonrl.algo.masked import masked_mean
from reasonrl.algo.value_loss import explained_variance

Edge = Literal["first", "last"]


def token_ranks(mask: Tensor) -> Tensor:
    """Index of each valid token among its row's valid tokens: [B, T] bool -> [B, T] long, −1 where masked."""
    mask = mask.bool()
    return torch.where(mask, mask.long().cumsum(1) - 1, torch.full_like(mask, -1, dtype=torch.long))


def _mean_over_rows(per_row: Tensor, rows: Tensor) -> Tensor:
    """Mean of per_row [B] over the rows [B] bool; NaN when there is none."""
    if not rows.any():
        return torch.tensor(math.nan, dtype=per_row.dtype)
    return per_row[rows].mean()


def edge_mean(x: Tensor, mask: Tensor, fraction: float, edge: Edge) -> Tensor:
    """Mean over rows of x's mean over each row's first (or last) ⌈fraction·l⌉ valid tokens, at least one.

    ``fraction=0`` reads exactly one token per row: the first (or last).  With advantages,
    ``fraction=0.1`` compares early and late tokens (VC-PPO: a critic biased at the start makes the
    early advantages biased).  x, mask: [B, T] -> [].
    """
    mask = mask.bool()
    lengths = mask.sum(1)  # [B]
    count = (lengths.double() * fraction - 1e-9).ceil().clamp(min=1).long()  # [B]; the guard: 0.1 × 30 = 3
    ranks = token_ranks(mask)  # [B, T]
    edge_tokens = ranks < count[:, None] if edge == "first" else ranks >= (lengths - count)[:, None]  # [B, T]
    inside = mask & edge_tokens
    per_row = masked_mean(x.to(torch.get_default_dtype()), inside, dim=1)  # [B]
    return _mean_over_rows(per_row, lengths > 0)


def position_buckets(mask: Tensor, buckets: int) -> Tensor:
    """Bucket of each valid token by its relative position, ⌊buckets · rank / l⌋: [B, T] long, −1 where masked.

    With 3 buckets: the first, middle and last third of each row (a row shorter than 3 tokens
    fills only the first buckets).
    """
    mask = mask.bool()
    lengths = mask.sum(1, keepdim=True).clamp(min=1)  # [B, 1]
    ranks = token_ranks(mask)  # [B, T]
    return torch.where(mask, ranks * buckets // lengths, torch.full_like(ranks, -1))


def explained_variance_by_position(values: Tensor, returns: Tensor, mask: Tensor, buckets: int = 3) -> Tensor:
    """``explained_variance`` (1 − Var(G − V)/Var(G)) over the tokens of each ``position_buckets`` bucket.

    values, returns, mask: [B, T] -> [buckets]; NaN for a bucket whose returns do not vary (or that
    is empty).
    """
    bucket = position_buckets(mask, buckets)  # [B, T]
    return torch.stack([explained_variance(values, returns, bucket == b) for b in range(buckets)])


def reward_reach(lam: Tensor, lengths: Tensor, gamma: float) -> Tensor:
    """Share of a terminal reward that reaches the first token's advantage: (γλ)^(l−1) per row.

    GAE's A_0 = Σ_k (γλ)^k δ_k (VAPO eq 3): the outcome reward enters δ_{l−1} only, so it reaches
    token 0 with weight (γλ)^(l−1) — the "reward signal decay" of VC-PPO (0.95^100 ≈ 0.006).  VAPO's
    length-adaptive λ = 1 − 1/(α·l) (eq 5) keeps it near e^(−1/α) whatever the length (up to
    the clamp λ ≤ 0.9999).
    lam, lengths: [B] -> [B]; a one-token row gets 1.
    """
    exponent = (lengths.to(torch.get_default_dtype()) - 1).clamp(min=0)  # [B]
    return torch.pow(gamma * lam.to(torch.get_default_dtype()), exponent)


def bucket_means(x: Tensor, key: Tensor, buckets: int) -> Tensor:
    """Means of x over the rows split by ``key`` into ``buckets`` equal-count groups, smallest key first.

    Rows are sorted by key (ties by index); row i of the sorted order falls in ⌊buckets · i / B⌋.
    E.g. the mean λ of the shortest, second, third and longest quarter of the responses.
    x, key: [B] -> [buckets]; NaN for an empty bucket (fewer rows than buckets).
    """
    order = torch.sort(key, stable=True).indices  # [B]
    which = torch.arange(len(order)) * buckets // max(1, len(order))  # [B] bucket of each sorted row
    x = x.to(torch.get_default_dtype())[order]
    return torch.stack([x[which == b].mean() if (which == b).any() else torch.tensor(math.nan) for b in range(buckets)])
