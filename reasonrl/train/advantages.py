"""The advantage stage: rewards on tokens, optional KL in the reward, then the preset's estimator."""

from __future__ import annotations

import torch

from reasonrl.algo.advantages import group_advantages, reinforce_pp_advantages, rloo_advantages, sequence_to_tokens
from reasonrl.algo.kl import kl_estimate, kl_penalized_rewards
from reasonrl.algo.presets import AlgoSpec
from reasonrl.algo.shaping import terminal_token_rewards
from reasonrl.batch import RolloutBatch


def assign_advantages(batch: RolloutBatch, spec: AlgoSpec, kl_coef: float) -> RolloutBatch:
    """Fill ``token_rewards`` and ``advantages`` (critic-free estimators) on the whole rollout batch.

    Outcome rewards sit on the last response token (spec §1.3).  With the KL in the reward,
    ``r_t −= β·kl_t``; group estimators then use the per-sequence sum of the token rewards.
    """
    token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # [B, T]
    if spec.kl_placement == "reward" and kl_coef > 0:
        assert batch.ref_logprobs is not None and batch.old_logprobs is not None
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, spec.kl_estimator)
        token_rewards = kl_penalized_rewards(token_rewards, kl, kl_coef, batch.response_mask)
    batch.token_rewards = token_rewards
    sequence_rewards = token_rewards.sum(-1)  # [B]
    if spec.advantage_estimator == "grpo":
        per_sequence = group_advantages(
            sequence_rewards, batch.group_ids, spec.group_norm_by_std, unbiased=spec.group_std_unbiased
        )
        batch.advantages = sequence_to_tokens(per_sequence, batch.response_mask).to(torch.float32)
    elif spec.advantage_estimator == "rloo":
        batch.advantages = sequence_to_tokens(rloo_advantages(sequence_rewards, batch.group_ids), batch.response_mask)
    elif spec.advantage_estimator == "reinforce_pp":
        batch.advantages, batch.returns = reinforce_pp_advantages(token_rewards, batch.response_mask, spec.gamma)
    else:
        raise NotImplementedError(
            f"advantage_estimator={spec.advantage_estimator!r} needs a critic, which this version cannot train yet"
        )
    return batch
