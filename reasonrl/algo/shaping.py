"""Reward shaping, reward placement on tokens, and the dynamic-sampling group filter."""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476 eq 13), scaled by ``factor`` (verl).

    R_length(|y|) = 0                                 if |y| ≤ L_max − L_cache
                  = ((L_max − L_cache) − |y|) / L_cache if L_max − L_cache < |y| ≤ L_max
                  = −1                                if |y| > L_max
    L_max is the hard generation cap, so the last branch only fires for over-cap inputs.
    lengths: [B] response lengths -> [B] penalties in [−factor, 0].
    """
    expected = max_len - cache_len
    ramp = (expected - lengths.to(torch.get_default_dtype())) / cache_len  # [B]
    return (ramp.clamp(min=-1.0, max=0.0) * factor).to(torch.get_default_dtype())


def nonconstant_group_mask(metric: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic-sampling filter predicate (eq 11 constraint 0 < #correct < G): which sequences to keep.

    A sequence is kept when its group's ``metric`` (accuracy by default: docs/algorithms.md, ambiguity 12) is not
    constant: all-correct and all-wrong groups carry zero group-normalised advantage.  Singleton
    groups are kept (verl).  metric, group_ids: [B] -> [B] bool.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    metric = metric.to(torch.float64)
    group_max = torch.full((counts.numel(),), -torch.inf, dtype=metric.dtype, device=metric.device)
    group_min = torch.full_like(group_max, torch.inf)
    group_max = group_max.scatter_reduce(0, inverse, metric, reduce="amax")
    group_min = group_min.scatter_reduce(0, inverse, metric, reduce="amin")
    return (group_max[inverse] > group_min[inverse]) | (counts[inverse] == 1)


def place_rewards(values: Tensor, positions: Tensor, valid: Tensor, length: int) -> Tensor:
    """Scatter per-item rewards onto token positions: out[b, positions[b, k]] += values[b, k].

    values, positions, valid: [B, K] -> [B, length].  Invalid items are dropped.  Used for
    per-turn (PAG) and per-line (process reward) rewards.
    """
    values = torch.where(valid.bool(), values, torch.zeros_like(values))
    positions = torch.where(valid.bool(), positions, torch.zeros_like(positions)).long()
    out = torch.zeros(values.shape[0], length, dtype=values.dtype, device=values.device)
    return out.scatter_add(1, positions, values)


def terminal_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Place each sequence's outcome reward on its last valid response token (docs/algorithms.md, Conventions 3).

    rewards: [B], response_mask: [B, T] -> token_rewards [B, T].  A row without valid tokens gets
    no reward.
    """
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.zeros_like(positions)).amax(dim=1)  # [B]
    rewards = rewards.to(torch.get_default_dtype()) if not rewards.is_floating_point() else rewards
    return place_rewards(rewards[:, None], last[:, None], mask.any(dim=1)[:, None], mask.shape[1])


def potential_shaping(potentials: Tensor, line_mask: Tensor, initial: Tensor, coef: float) -> Tensor:
    """Potential-based dense reward for process supervision (PRM-guided code RL, arXiv 2410.17621; Ng et al. 1999).

    r_ℓ = c·(Φ(prefix_ℓ) − Φ(prefix_ℓ′)), ℓ′ the previous valid line (or the empty prefix, Φ_0).
    The sum telescopes to c·(Φ_last − Φ_0) whatever the number of lines, so adding lines cannot farm
    reward.  Lines outside ``line_mask`` (e.g. comments) get 0 and do not break the chain.
    potentials (PRM scores), line_mask: [B, K]; initial: [B] Φ_0 -> [B, K] line rewards.
    """
    valid = line_mask.bool()
    batch, lines = potentials.shape
    index = torch.arange(lines, device=potentials.device).expand(batch, lines)
    last_valid = torch.where(valid, index, torch.full_like(index, -1)).cummax(dim=1).values  # [B, K]
    previous = torch.cat([torch.full_like(last_valid[:, :1], -1), last_valid[:, :-1]], dim=1)  # [B, K]
    chain = torch.cat([initial[:, None].to(potentials.dtype), potentials], dim=1)  # [B, 1 + K]
    previous_potential = chain.gather(1, previous + 1)  # [B, K]
    shaped = coef * (potentials - previous_potential)
    return torch.where(valid, shaped, torch.zeros_like(shaped))


def paper_line_rewards(
    scores: Tensor, line_mask: Tensor, passed: Tensor, lambda_failing: float = 0.25, lambda_passing: float = 0.025
) -> Tensor:
    """The PRM-for-code paper's dense reward (arXiv 2410.17621, Eq. 3 with §4.3.3's safeguards): each line
    gets λ·PRM(prefix_ℓ) / n, n the response's rewarded lines (length normalisation: more lines of the
    same score add nothing), λ = ``lambda_failing`` for a response that fails its tests and
    ``lambda_passing`` for one that passes; lines outside ``line_mask`` (comments, repeats, text around the
    code) get 0.
    scores (PRM scores on the reward scale), line_mask: [B, K]; passed: [B] bool -> [B, K] line rewards.
    """
    valid = line_mask.bool()
    lines = valid.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
    lam = torch.where(passed.bool(), lambda_passing, lambda_failing).to(scores.dtype)[:, None]  # [B, 1]
    return torch.where(valid, lam * scores / lines, torch.zeros_like(scores))
