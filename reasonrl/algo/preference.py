"""Preference-model math: Bradley-Terry, pairwise verdict probabilities, position debiasing.

Pure torch; shapes in comments.  Used by the reward models (``reasonrl/reward/bt.py``,
``reasonrl/reward/pairwise.py``) and by Pre-PPO prompt selection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(chosen: Tensor, rejected: Tensor, margin: float = 0.0) -> Tensor:
    """L = −mean log σ(s_chosen − s_rejected − margin) (Bradley & Terry 1952; InstructGPT eq 1).

    chosen, rejected: [N] scalar scores of the preferred and the dispreferred response -> [].
    """
    return -F.logsigmoid(chosen - rejected - margin).mean()


def pairwise_accuracy(chosen: Tensor, rejected: Tensor) -> float:
    """Fraction of pairs where the chosen response scores higher, a tie counting ½ (chance = 0.5): [N], [N] -> float."""
    return ((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean().item()


def verdict_probability(logit_a: Tensor, logit_b: Tensor) -> Tensor:
    """P(A ≻ B) = p("A") / (p("A") + p("B")) from the two verdict tokens' logits (Pairwise-RL, arXiv 2504.04950).

    The softmax over the rest of the vocabulary cancels: this is σ(logit_A − logit_B).  [N], [N] -> [N].
    """
    return torch.sigmoid(logit_a - logit_b)


def pairwise_judge_loss(logit_a: Tensor, logit_b: Tensor, a_is_better: Tensor) -> Tensor:
    """Cross-entropy of the two-way verdict against the human label: [N], [N], [N] bool -> []."""
    return F.binary_cross_entropy_with_logits(logit_a - logit_b, a_is_better.to(logit_a.dtype))


def position_debiased_reward(p_response_first: Tensor, p_reference_first: Tensor) -> Tensor:
    """R(y, y_ref) = ½·[P(y ≻ y_ref | y shown first) + 1 − P(y_ref ≻ y | y_ref shown first)] (Pairwise-RL).

    In [0, 1]; 0.5 = parity with the reference.  R(y, y_ref) + R(y_ref, y) = 1 and R(y, y) = 0.5
    hold whatever the judge, because each order's probability enters both rewards with opposite
    signs.  [N], [N] -> [N].
    """
    return 0.5 * (p_response_first + 1.0 - p_reference_first)


def domain_zscores(scores: Tensor, domains: list[str]) -> Tensor:
    """z-normalise scores within each domain (Pre-PPO, Data-Scaling RLHF arXiv 2503.22230 §4): [N] -> [N].

    A domain with one prompt or zero variance gets z = 0.  Invariant to any per-domain affine map
    s -> a·s + b with a > 0.
    """
    out = torch.zeros_like(scores, dtype=torch.float64)
    for domain in sorted(set(domains)):
        index = torch.tensor([i for i, d in enumerate(domains) if d == domain])
        values = scores[index].to(torch.float64)
        std = values.std(unbiased=False) if len(values) > 1 else torch.tensor(0.0, dtype=torch.float64)
        out[index] = (values - values.mean()) / std if std > 0 else torch.zeros_like(values)
    return out
