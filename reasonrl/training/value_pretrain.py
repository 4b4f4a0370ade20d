"""Value pretraining (VC-PPO arXiv 2503.01491; VAPO arXiv 2504.05118 §5.1 "value warm-up").

Before any policy update, sample from the frozen initial policy and regress the critic on
Monte-Carlo returns (GAE with λ = 1, γ from the preset) for a step budget, stopping early once the
explained variance reaches a target.  The policy is never touched: no optimiser step, no weight
sync.  Each step is one fresh rollout batch, so the logged EV (values before the update against
that batch's returns) is a held-out estimate.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reasonrl.algo.advantage_estimators import gae
from reasonrl.algo.shaping import terminal_token_rewards
from reasonrl.batch import padding_summary
from reasonrl.timing import timed
from reasonrl.training.rollouts.rollout_stage import RolloutCollector, hash_seed
from reasonrl.training.update.advantage_stage import value_fit_stats
from reasonrl.training.update.critic import CriticUpdater

PRETRAIN_SEED_SALT = 7919  # keeps pretraining's sampler seeds apart from the RL steps'


def pretrain_critic(
    collector: RolloutCollector,
    critic: CriticUpdater,
    *,
    steps: int,
    ev_target: float | None,
    gamma: float,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None],
    calibrate_bias: bool = False,
) -> int:
    """Run up to ``steps`` critic-only steps; ``on_step(step, metrics)`` records each.  Returns the steps run.

    ``calibrate_bias`` (a fresh zero head): before the first update, set the head's bias to the mean
    return of the first batch, so V starts at the best constant prediction instead of 0.  At a
    few-minute budget the critic otherwise spends its whole pretraining walking its output towards
    the mean return (Adam moves each weight by about the learning rate per step).
    """
    for step in range(1, steps + 1):
        metrics: dict[str, float] = {}
        with timed(metrics, "perf/step_seconds"):
            batch, rollout_metrics = collector.collect(0, seed_step=hash_seed(PRETRAIN_SEED_SALT, step))
            metrics |= rollout_metrics
            token_rewards = terminal_token_rewards(batch.rewards, batch.response_mask)  # [B, T]
            if calibrate_bias and step == 1:
                _, returns = gae(token_rewards, torch.zeros_like(token_rewards), batch.response_mask, gamma, 1.0)
                with torch.no_grad():
                    critic.model.head.bias.fill_(returns[batch.value_loss_mask].mean().item())
            batch.values = critic.values(batch)
            _, batch.returns = gae(token_rewards, batch.values, batch.response_mask, gamma, 1.0)  # Monte-Carlo
            batch.token_rewards = token_rewards
            metrics |= value_fit_stats(batch, gamma)
            metrics = padding_summary(metrics | critic.update(batch, seed=hash_seed(seed, PRETRAIN_SEED_SALT, step)))
        on_step(step, metrics)
        if ev_target is not None and metrics["critic/explained_variance"] >= ev_target:
            return step
    return steps
