"""Offline training steps: DPO and DQO on a dataset sampled beforehand (``reasonrl data sample``).

An offline run is an online run whose step reads a mini-batch of the dataset instead of generating
one: the same setup, evaluation before and after, metrics, checkpoints, resume and export (``fit``).
What each step reads is ``reasonrl.training.update.offline_batches``.  The reference policy's log-probs of the
responses are computed once, before the first step, and kept in the run directory.

``dpo_step`` (arXiv 2305.18290) and ``dqo_step`` (arXiv 2410.09302) each read top to bottom; the math is
``reasonrl.algo.offline_objectives``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from reasonrl.algo.masked import masked_mean
from reasonrl.algo.offline_objectives import (
    dpo_losses,
    dqo_policy_loss,
    dqo_targets,
    dqo_value_loss,
    importance_weights,
)
from reasonrl.algo.value_loss import explained_variance
from reasonrl.batch import RolloutBatch
from reasonrl.data.loaders import DataError
from reasonrl.models.lora import adapters_disabled
from reasonrl.models.optim import apply_gradients
from reasonrl.models.untrusted import load_tensor_file
from reasonrl.timing import timed
from reasonrl.training.update.offline_batches import OfflineData, samples_batch

if TYPE_CHECKING:
    from reasonrl.training.setup import Run

REFERENCE_CACHE = "reference_logprobs.pt"


def compute_reference(run: Run, data: OfflineData, cache: Path) -> None:
    """log π_ref of every response the run trains on, into ``data.reference``: loaded from ``cache``, else
    computed once and saved.  A cache of another dataset (the file changed since the run began) is refused."""
    if cache.exists():
        saved = load_tensor_file(cache)
        if saved.get("fingerprint") != data.fingerprint:
            raise DataError(
                f"the offline dataset changed since this run began ({cache} was computed for other samples); "
                "continue the run with the file it started with, or start a new run"
            )
        data.reference = saved["logprobs"]
        return
    needed = sorted({i for item in data.items for i in item})
    batch = samples_batch([data.samples[i] for i in needed])
    out = torch.zeros(batch.response_mask.shape)
    with torch.no_grad():
        policy = run.updater.policy
        for rows in batch.micro_batch_rows(
            run.plan.microbatch_tokens, policy.packed, policy.share_prompts, policy.lanes
        ):
            part = batch.select(rows)
            if run.reference is not None:
                logprobs, _ = run.reference(part)
            else:  # LoRA: the policy with its adapters switched off
                with adapters_disabled(run.model):
                    logprobs, _ = run.updater.policy(part)
            out[rows, : logprobs.shape[1]] = logprobs.cpu()
    lengths = batch.response_mask.sum(1).tolist()
    data.reference = {i: out[row, : lengths[row]].clone() for row, i in enumerate(needed)}
    partial = cache.with_name(cache.name + ".partial")
    torch.save({"fingerprint": data.fingerprint, "logprobs": data.reference}, partial)
    partial.replace(cache)


def pair_micro_rows(batch: RolloutBatch, token_budget: int) -> list[list[int]]:
    """Micro-batches of whole DPO pairs (rows 2i, 2i+1) whose padded size fits ``token_budget``; a
    pair over the budget still forms its own micro-batch."""
    prompts, responses = batch.prompt_mask.sum(1).tolist(), batch.response_mask.sum(1).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    for pair in range(len(batch) // 2):
        rows = [*current, 2 * pair, 2 * pair + 1]
        padded = (max(prompts[r] for r in rows) + max(responses[r] for r in rows)) * len(rows)  # prompt + response
        if current and padded > token_budget:
            groups.append(current)
            rows = [2 * pair, 2 * pair + 1]
        current = rows
    return groups + ([current] if current else [])


def policy_step(run: Run) -> float:
    """Apply the policy's accumulated gradient (clipped, with the LR schedule); returns its norm."""
    return apply_gradients(run.updater.policy, run.updater.optimizer, run.cfg.train.grad_clip, run.updater.scheduler)


def dpo_step(run: Run, data: OfflineData, step: int) -> dict[str, float]:
    """One DPO optimiser step on the step's pairs: −log σ(β·[log π_θ/π_ref(y_w) − log π_θ/π_ref(y_l)]),
    averaged over the pairs (arXiv 2305.18290, eq. 7); micro-batches hold whole pairs."""
    beta, policy = run.cfg.algo.offline_beta, run.updater.policy
    batch = data.batch(data.step_rows(step))
    pairs = len(batch) // 2
    sums: dict[str, float] = defaultdict(float)
    policy.model.train()
    for rows in pair_micro_rows(batch, run.plan.microbatch_tokens):
        micro = batch.select(rows).to(run.updater.device)
        logprobs, _ = policy(micro)  # [b, T]
        mask = micro.response_mask
        sequence = (logprobs * mask).sum(1)  # [b] Σ_t log π_θ
        reference = (micro.ref_logprobs * mask).sum(1)
        losses, chosen, rejected = dpo_losses(sequence[0::2], sequence[1::2], reference[0::2], reference[1::2], beta)
        loss = losses.sum() / pairs
        loss.backward()
        sums["loss/dpo"] += loss.item()
        sums["reward/chosen"] += chosen.sum().item() / pairs
        sums["reward/rejected"] += rejected.sum().item() / pairs
        sums["reward/pairwise_accuracy"] += ((chosen > rejected).float().sum().item()) / pairs
    policy.model.eval()
    sums["reward/margin"] = sums["reward/chosen"] - sums["reward/rejected"]
    sums["train/grad_norm"] = policy_step(run)
    return dict(sums)


def dqo_step(run: Run, data: OfflineData, step: int) -> dict[str, float]:
    """One DQO step on the step's responses (arXiv 2410.09302): fit Q_θ = β·log(π_θ/π_ref) + V_φ and V_φ
    to the λ-return of the soft step rewards, importance-weighted from the behaviour policy."""
    a, policy, critic = run.cfg.algo, run.updater.policy, run.critic
    assert critic is not None, "DQO trains a value model (algo.uses_critic)"
    batch = data.batch(data.step_rows(step))
    tokens = int(batch.response_mask.sum())
    # 1. V_φ(s_h) of every state, before this step's updates (no gradient)
    batch.values = critic.values(batch)
    micros = batch.micro_batches(
        run.plan.microbatch_tokens, run.updater.device, policy.packed, policy.share_prompts, policy.lanes
    )
    sums: dict[str, float] = defaultdict(float)
    returns, value_weights = [], []
    policy.model.train()
    for micro in micros:
        mask = micro.response_mask
        logprobs, entropy = policy(micro)
        logratio = logprobs - micro.ref_logprobs
        # 2. the λ-return G and the Q target y, from the soft step rewards r − β·log(π_θ/π_ref)
        g, y = dqo_targets(micro.token_rewards, logratio.detach(), micro.values, mask, a.offline_beta, a.dqo_lambda)
        # 3. per-decision importance weights from the behaviour policy μ to π_θ (§3.3)
        if a.dqo_importance_weights:
            w_q, w_v = importance_weights(logprobs.detach(), micro.rollout_logprobs, mask, a.dqo_weight_clip)
        else:
            w_q = w_v = mask.float()
        # 4. the Q regression trains the policy, V_φ held fixed
        loss = dqo_policy_loss(logratio, micro.values, y, w_q, mask, a.offline_beta, tokens)
        loss.backward()
        returns.append(g)
        value_weights.append(w_v)
        share = mask.sum().item() / tokens
        sums["loss/dqo_q"] += loss.item()
        if entropy is not None:  # Liger's head computes none
            sums["policy/entropy"] += masked_mean(entropy.detach(), mask).item() * share
        sums["policy/logratio_ref"] += masked_mean(logratio.detach(), mask).item() * share
        sums["dqo/weight_mean"] += masked_mean(w_q, mask).item() * share
        if a.dqo_weight_clip is not None:
            sums["dqo/weight_clip_frac"] += masked_mean((w_q >= a.dqo_weight_clip).float(), mask).item() * share
        sums["dqo/return_mean"] += masked_mean(g, mask).item() * share
        sums["dqo/return_first_token"] += g[:, 0].sum().item() / len(batch)
    policy.model.eval()
    sums["train/grad_norm"] = policy_step(run)
    # 5. the V regression trains the value model on the same λ-returns
    critic.model.train()
    for micro, g, w_v in zip(micros, returns, value_weights, strict=True):
        mask = micro.response_mask
        values = critic.forward_values(micro)
        loss = dqo_value_loss(values, g, w_v, mask, tokens)
        loss.backward()
        sums["critic/value_loss"] += loss.item()
    critic.model.eval()
    sums["critic/grad_norm"] = apply_gradients(critic.model, critic.optimizer, critic.grad_clip)
    all_returns = torch.zeros_like(batch.values)
    row_groups = batch.micro_batch_rows(run.plan.microbatch_tokens, policy.packed, policy.share_prompts, policy.lanes)
    for rows, g in zip(row_groups, returns, strict=True):
        all_returns[rows, : g.shape[1]] = g.cpu()
    sums["critic/explained_variance"] = explained_variance(batch.values, all_returns, batch.response_mask).item()
    return dict(sums)


OFFLINE_STEPS = {"dpo": dpo_step, "dqo": dqo_step}


def offline_step(run: Run, data: OfflineData, step: int) -> dict[str, float]:
    """One offline step (algo.offline): the objective's optimiser step(s) on the step's mini-batch."""
    metrics: dict[str, float] = {}
    with timed(metrics, "perf/update_seconds"):
        metrics |= OFFLINE_STEPS[run.cfg.algo.offline](run, data, step)
    metrics["train/lr"] = run.updater.scheduler.get_last_lr()[0]
    return metrics
