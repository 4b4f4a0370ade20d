"""The advantage stage: rewards on tokens, optional KL in the reward, then the preset's estimator."""

from __future__ import annotations

import functools
import logging

import torch

from reasonrl.algo.advantage_estimators import (
    decoupled_gae,
    group_advantages,
    length_adaptive_lambda,
    reinforce_pp_advantages,
    reward_to_go,
    rloo_advantages,
    sequence_to_tokens,
)
from reasonrl.algo.diagnostics import bucket_means, edge_mean, explained_variance_by_position, reward_reach
from reasonrl.algo.kl import kl_estimate, kl_penalized_rewards
from reasonrl.algo.masked import masked_mean, masked_whiten, role_whiten
from reasonrl.algo.presets import AlgoSpec
from reasonrl.algo.shaping import terminal_token_rewards
from reasonrl.batch import RolloutBatch

LAMBDA_BUCKETS = 4  # critic/lambda_policy_q1..q4: by response-length quartile
EDGE_FRACTION = 0.1  # critic/advantage_first_10pct, critic/advantage_last_10pct
POSITION_BUCKETS = ("early", "middle", "late")  # critic/explained_variance_<bucket>: thirds of each response
CLAMPED_LAMBDA_WARNING = 0.5  # warn once when length-adaptive λ_policy is 0 for this fraction of a batch or more
log = logging.getLogger(__name__)


def policy_lambda(spec: AlgoSpec, response_mask: torch.Tensor) -> torch.Tensor:
    """λ_policy per sequence [B]: the preset's constant, or VAPO's length-adaptive 1 − 1/(α·l)."""
    lengths = response_mask.sum(1)  # [B]
    if spec.lambda_policy_mode == "length_adaptive":
        return length_adaptive_lambda(lengths, spec.length_alpha)
    return torch.full(lengths.shape, spec.lambda_policy, dtype=torch.get_default_dtype())


@functools.cache  # once per run (per α)
def warn_lambda_clamped(alpha: float) -> None:
    log.warning(
        "length-adaptive λ_policy (VAPO eq 5, algo.length_alpha=%g) is 0 for half or more of a batch's responses "
        "(those of %d tokens or fewer): their policy advantages are one-step TD errors that rest on the critic "
        "alone, and an untrained critic gives them no learning signal (critic/lambda_clamped_fraction; "
        'docs/algorithms.md, "VAPO\'s α on short answers"). On short answers, pretrain the critic '
        "(algo.value_pretrain_steps) or use algo.lambda_policy_mode=fixed",
        alpha,
        int(1 / alpha),
    )


def critic_advantages(batch: RolloutBatch, spec: AlgoSpec) -> dict[str, float]:
    """GAE with decoupled λ: policy advantages from λ_policy, critic targets (returns) from λ_critic.

    ``egae`` (T-PPO) bootstraps the sequences still running (``batch.pool_window.running``) from their last
    value; a running sequence's length-adaptive λ uses its current length (docs/algorithms.md, ambiguity 20)."""
    window = batch.pool_window if spec.advantage_estimator == "egae" else None
    assert spec.advantage_estimator == "gae" or window is not None, "egae needs a pooled batch (batch.pool_window)"
    assert batch.values is not None and batch.token_rewards is not None, "the critic's values come first"
    lam = policy_lambda(spec, batch.response_mask)  # [B]
    batch.advantages, batch.returns = decoupled_gae(
        batch.token_rewards,
        batch.values,
        batch.response_mask,
        spec.gamma,
        lam,
        spec.lambda_critic,
        mask_mode=spec.gae_mask_mode,
        running=None if window is None else window.running,
    )
    stats = {"critic/lambda_policy_mean": lam.mean().item()}
    if spec.lambda_policy_mode == "length_adaptive":
        stats["critic/lambda_clamped_fraction"] = (lam <= 0).float().mean().item()
        if stats["critic/lambda_clamped_fraction"] >= CLAMPED_LAMBDA_WARNING:
            warn_lambda_clamped(spec.length_alpha)
        quartiles = bucket_means(lam, batch.response_mask.sum(1), LAMBDA_BUCKETS)  # shortest responses first
        stats |= {f"critic/lambda_policy_q{i + 1}": value for i, value in enumerate(quartiles.tolist())}
    return stats | reward_decay_stats(batch, lam, spec.gamma) | value_fit_stats(batch, spec.gamma)


def reward_decay_stats(batch: RolloutBatch, lam: torch.Tensor, gamma: float) -> dict[str, float]:
    """The policy advantages by position, before any whitening (VC-PPO's value-initialisation bias shows as
    early advantages far from late ones), and the share (γλ)^(l−1) of the outcome reward reaching the first
    token (reward signal decay), with the λ [B] each response's advantages used."""
    response = batch.response_mask
    lengths = response.sum(1)  # [B]
    reach = reward_reach(lam, lengths, gamma)[lengths > 0]
    return {
        "critic/advantage_first_10pct": edge_mean(batch.advantages, response, EDGE_FRACTION, "first").item(),
        "critic/advantage_last_10pct": edge_mean(batch.advantages, response, EDGE_FRACTION, "last").item(),
        "policy/reward_reach_first_token": reach.mean().item() if len(reach) else float("nan"),
    }


def value_fit_stats(batch: RolloutBatch, gamma: float) -> dict[str, float]:
    """How well the rollout-time values V predict this batch, by position, over the value-loss tokens
    (T-PPO: the finished responses, whose return is known): |V − G| at the first and the last token with G
    the Monte-Carlo return (the truth, whatever λ_critic), and the explained variance against the critic's
    targets (``batch.returns``) in each third of the responses."""
    assert batch.values is not None and batch.returns is not None and batch.token_rewards is not None
    fitted = batch.value_loss_mask
    error = (batch.values - reward_to_go(batch.token_rewards, batch.response_mask, gamma)).abs()  # [B, T]
    by_position = explained_variance_by_position(batch.values, batch.returns, fitted, len(POSITION_BUCKETS)).tolist()
    return {
        "critic/value_error_first_token": edge_mean(error, fitted, 0.0, "first").item(),
        "critic/value_error_last_token": edge_mean(error, fitted, 0.0, "last").item(),
        **{f"critic/explained_variance_{name}": ev for name, ev in zip(POSITION_BUCKETS, by_position, strict=True)},
    }


def assign_advantages(batch: RolloutBatch, spec: AlgoSpec, kl_coef: float) -> dict[str, float]:
    """Fill ``token_rewards``, ``advantages`` (and ``returns`` where the estimator has them); returns metrics.

    Outcome rewards sit on the last response token (docs/algorithms.md, Conventions 3).  With the KL in the reward,
    ``r_t −= β·kl_t``; group estimators then use the per-sequence sum of the token rewards.
    Critic estimators need ``batch.values``.  ``advantage_norm=batch_whiten`` then whitens the
    advantages over the policy-loss tokens of the whole rollout batch (verl).
    """
    if batch.turns is not None:  # multi-turn: every turn is rewarded on its own last token (PAG eq 1)
        token_rewards = batch.turns.rewards.clone()
    else:
        token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # [B, T]
    if batch.dense_rewards is not None:  # process rewards on line-end tokens (reward.prm_dense)
        token_rewards = token_rewards + batch.dense_rewards
    if spec.kl_placement == "reward" and kl_coef > 0:
        assert batch.ref_logprobs is not None and batch.old_logprobs is not None
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, spec.kl_estimator)
        token_rewards = kl_penalized_rewards(token_rewards, kl, kl_coef, batch.response_mask)
    batch.token_rewards = token_rewards
    sequence_rewards = token_rewards.sum(-1)  # [B]
    stats: dict[str, float] = {}
    if spec.advantage_estimator == "grpo":
        per_sequence = group_advantages(
            sequence_rewards, batch.group_ids, spec.group_norm_by_std, unbiased=spec.group_std_unbiased
        )
        batch.advantages = sequence_to_tokens(per_sequence, batch.response_mask).to(torch.float32)
    elif spec.advantage_estimator == "rloo":
        batch.advantages = sequence_to_tokens(rloo_advantages(sequence_rewards, batch.group_ids), batch.response_mask)
    elif spec.advantage_estimator == "reinforce_pp":
        batch.advantages, batch.returns = reinforce_pp_advantages(token_rewards, batch.response_mask, spec.gamma)
    else:  # gae, egae
        stats |= critic_advantages(batch, spec)
    stats["policy/advantage_mean"] = masked_mean(batch.advantages, batch.policy_loss_mask).item()
    if spec.advantage_norm == "batch_whiten":
        batch.advantages = masked_whiten(batch.advantages, batch.policy_loss_mask)
    elif spec.advantage_norm == "role_whiten":  # over the whole rollout batch, before mini-batching (PAG ambiguity 4)
        roles = (
            batch.turns.role_ids if batch.turns is not None else torch.zeros_like(batch.response_mask, dtype=torch.long)
        )
        batch.advantages = role_whiten(batch.advantages, roles, batch.policy_loss_mask)  # single-turn: one role
    return stats
