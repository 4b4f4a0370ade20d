"""PAG — Policy as Generative Verifier (arXiv 2506.10406): per-turn rewards.

A trajectory alternates policy attempts y_1, y_2, ... and verify turns v_2, v_3, ...; every turn is
rewarded on its own last token (PAG eq 1; docs/algorithms.md, Conventions 3).  Role-wise advantage normalisation is
``reasonrl.algo.masked.role_whiten``; turn-independent GAE is ``gae(..., mask_mode="reset")``.
"""

from __future__ import annotations

import torch
from torch import Tensor

VERDICT_CORRECT = 1
VERDICT_WRONG = 0
VERDICT_UNPARSED = -1


def pag_attempt_rewards(attempt_correct: Tensor, attempt_mask: Tensor, alpha: float = 1.0) -> Tensor:
    """Policy-turn rewards with the revision bonus (PAG eq 1 and §3.2).

    R(y_1) = acc_1;   R(y_t) = acc_t + α·(acc_t − acc_{t−1}) for t ≥ 2.
    With α = 1: wrong→correct = 2, correct→wrong = −1, correct→correct = 1, wrong→wrong = 0.
    attempt_correct (0/1), attempt_mask: [B, N] (attempts in order) -> [B, N], 0 where masked.
    """
    acc = attempt_correct.to(torch.get_default_dtype())
    bonus = torch.zeros_like(acc)  # the first attempt has no bonus term
    bonus[:, 1:] = alpha * (acc[:, 1:] - acc[:, :-1])
    rewards = acc + bonus
    return torch.where(attempt_mask.bool(), rewards, torch.zeros_like(rewards))


def pag_verify_rewards(verdicts: Tensor, previous_correct: Tensor, verify_mask: Tensor) -> Tensor:
    """Verifier-turn rewards (PAG eq 1): 1 when the verdict matches the previous attempt's truth, else 0.

    verdicts: [B, N] ints (VERDICT_CORRECT, VERDICT_WRONG, VERDICT_UNPARSED: an unparseable
    verdict earns 0); previous_correct: [B, N] 0/1 truth of the attempt being verified;
    verify_mask: [B, N] -> [B, N].
    """
    truth = previous_correct.bool()
    right = ((verdicts == VERDICT_CORRECT) & truth) | ((verdicts == VERDICT_WRONG) & ~truth)
    return (right & verify_mask.bool()).to(torch.get_default_dtype())
