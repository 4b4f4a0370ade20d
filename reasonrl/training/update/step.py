"""The policy update: K epochs over mini-batches, micro-batched, with global loss denominators.

Actor loss = policy surrogate + μ·NLL(correct) + β·KL (loss placement) − c·entropy, each term
aggregated with denominators counted over the whole mini-batch, so the gradient is the same
whatever the micro-batch split (docs/algorithms.md, Conventions 5).  A step whose gradient is not finite is skipped.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from reasonrl.algo.aggregate import aggregate, count_for_aggregation
from reasonrl.algo.kl import kl_estimate
from reasonrl.algo.masked import masked_mean
from reasonrl.algo.off_policy import behaviour_log_ratio, correction_stats, importance_weights
from reasonrl.algo.policy_loss import positive_example_nll, ppo_clip
from reasonrl.algo.presets import AlgoSpec
from reasonrl.batch import FORWARD_TALLY_PREFIXES, ForwardTally, RolloutBatch
from reasonrl.models.forward import weight_casts_kept
from reasonrl.models.optim import NonFiniteWeightsError, apply_gradients, has_non_finite_weights
from reasonrl.training.placement.parallel import SINGLE_PROCESS, DataParallel, reduce_gradients_after
from reasonrl.training.update.policy import TokenLogprobs, head_tokens

# metrics (these keys and those they begin) summed over the step's optimiser steps, not averaged
STEP_TOTALS = ("perf/lm_head_tokens_policy", *FORWARD_TALLY_PREFIXES)
CORRECTION_MAXIMA = ("rollout/is_weight_max",)  # the largest over micro-batches and mini-batches, not a mean


@dataclass(frozen=True)
class RolloutCorrection:
    """How the policy loss corrects for the policy that sampled each token (``Plan.rollout_correction``,
    algo.rollout_correction_level, ``Plan.rollout_correction_threshold``; reasonrl.algo.off_policy)."""

    mode: str = "none"
    level: str = "token"
    threshold: float = 2.0


class PolicyUpdater:
    """Applies the actor loss of an AlgoSpec to a policy with its optimiser and LR schedule.

    Data-parallel (``parallel``): every rank holds the whole batch and trains on its share of each
    mini-batch's rows, with the loss denominators of the whole mini-batch; FSDP2 sums the gradients.
    """

    def __init__(
        self,
        policy: TokenLogprobs,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        spec: AlgoSpec,
        *,
        minibatch_sequences: int,
        epochs: int,
        microbatch_tokens: int,
        grad_clip: float | None,
        loss_agg_constant: float | None,
        parallel: DataParallel = SINGLE_PROCESS,
        correction: RolloutCorrection = RolloutCorrection(),
    ) -> None:
        self.policy, self.optimizer, self.scheduler, self.spec = policy, optimizer, scheduler, spec
        self.correction = correction
        self.minibatch_sequences, self.epochs, self.microbatch_tokens = minibatch_sequences, epochs, microbatch_tokens
        self.grad_clip, self.loss_agg_constant, self.parallel = grad_clip, loss_agg_constant, parallel
        self.skipped_steps = 0

    @property
    def model(self) -> torch.nn.Module:
        """The policy (a Hugging Face causal LM)."""
        return self.policy.model

    @property
    def device(self) -> torch.device:
        """Where the model is: each micro-batch moves there."""
        return next(self.model.parameters()).device

    def _aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, tokens, seqs) -> torch.Tensor:
        return aggregate(per_token, mask, self.spec.loss_agg, tokens, seqs, self.loss_agg_constant)

    def _minibatch_step(self, minibatch: RolloutBatch, kl_coef: float) -> dict[str, float]:
        spec = self.spec
        mask = minibatch.policy_loss_mask
        tokens, seqs = count_for_aggregation(mask)
        nll_tokens = (mask & minibatch.correct[:, None]).sum()
        sums: dict[str, float] = defaultdict(float)
        packed, share_prompts, lanes = self.policy.packed, self.policy.share_prompts, self.policy.lanes
        micros = my_micro_batches(
            minibatch, self.parallel, self.microbatch_tokens, self.device, packed, share_prompts, lanes
        )
        tally = ForwardTally("policy")
        with weight_casts_kept(self.model):  # until the optimiser step
            for index, micro in enumerate(micros):
                reduce_gradients_after(self.policy, last=index == len(micros) - 1)
                tally.add(micro, packed=packed, share_prompts=share_prompts, lanes=lanes)
                micro_mask = micro.policy_loss_mask
                # the LM head only where the loss reads (T-PPO's token filtering: earlier windows' tokens are out)
                logprobs, entropy = self.policy(micro, head_mask=micro_mask)
                sums["perf/lm_head_tokens_policy"] += head_tokens(micro, micro_mask)
                # without a separate pass, this forward runs at the old policy (one mini-batch, one epoch): its gap to
                # the engine's log-probs is the step's engine-vs-trainer gap
                old_logprobs = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
                per_token, stats = ppo_clip(
                    logprobs, old_logprobs, micro.advantages, micro_mask, spec.eps_low, spec.eps_high, spec.dual_clip
                )
                share = micro_mask.sum().item() / max(1, int(tokens))
                if micro.old_logprobs is None and micro_mask.any():
                    gap = (old_logprobs - micro.rollout_logprobs.to(old_logprobs.device)).abs()
                    sums["rollout/logprob_abs_diff"] += masked_mean(gap, micro_mask).item() * share
                if self.correction.mode != "none":  # each token's loss weighted by π_prox / π_behav
                    log_ratio = behaviour_log_ratio(old_logprobs, micro.rollout_logprobs, micro_mask)
                    c = self.correction
                    weights, keep = importance_weights(log_ratio, micro_mask, c.mode, c.level, c.threshold)
                    per_token = per_token * weights
                    for key, value in correction_stats(log_ratio, weights, keep, micro_mask).items():
                        sums[key] = max(sums[key], value) if key in CORRECTION_MAXIMA else sums[key] + value * share
                policy_loss = self._aggregate(per_token, micro_mask, tokens, seqs)
                loss = policy_loss
                if spec.nll_weight:
                    nll = positive_example_nll(logprobs, micro_mask, micro.correct, global_tokens=nll_tokens)
                    loss = loss + spec.nll_weight * nll
                    sums["loss/nll"] += nll.item()
                if spec.kl_placement == "loss" and kl_coef > 0:
                    kl = self._aggregate(
                        kl_estimate(logprobs, micro.ref_logprobs, spec.kl_estimator), micro_mask, tokens, seqs
                    )
                    loss = loss + kl_coef * kl
                    sums["loss/kl"] += kl.item()
                if spec.entropy_coef:
                    loss = loss - spec.entropy_coef * self._aggregate(entropy, micro_mask, tokens, seqs)
                loss.backward()
                sums["loss/policy"] += policy_loss.item()
                sums["loss/total"] += loss.item()
                if entropy is not None:  # Liger's head computes none
                    sums["policy/entropy"] += masked_mean(entropy.detach(), micro_mask).item() * share
                for key, value in stats.items():
                    sums[f"policy/{key}"] += value.item() * share
        sums = self.parallel.sum_metrics(sums | tally.metrics())
        grad_norm = apply_gradients(self.policy, self.optimizer, self.grad_clip, self.scheduler)
        self.skipped_steps += not math.isfinite(grad_norm)
        sums["train/grad_norm"] = grad_norm
        return dict(sums)

    def update(self, batch: RolloutBatch, seed: int, kl_coef: float = 0.0) -> dict[str, float]:
        """All epochs over shuffled mini-batches of ``batch``; returns metrics averaged over mini-batches
        (but ``STEP_TOTALS``, summed)."""
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        maxima: dict[str, float] = {}
        for minibatch in shuffled_minibatches(batch, self.minibatch_sequences, self.epochs, seed):
            for key, value in self._minibatch_step(minibatch, kl_coef).items():
                totals[key] += value
                if key in CORRECTION_MAXIMA:
                    maxima[key] = max(maxima.get(key, value), value)
            steps += 1
        self.model.eval()
        refuse_non_finite_weights(self.model, self.parallel, "policy", self.scheduler.get_last_lr()[0], "train.lr")
        metrics = {key: value if key.startswith(STEP_TOTALS) else value / steps for key, value in totals.items()}
        metrics |= {key: maximum for key, maximum in maxima.items()}
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        metrics["train/skipped_steps"] = float(self.skipped_steps)
        return metrics


def refuse_non_finite_weights(
    model: torch.nn.Module, parallel: DataParallel, role: str, lr: float, setting: str
) -> None:
    """Stop the run (NonFiniteWeightsError, on every rank) when an update left ``model``'s weights NaN or
    infinite: the run ends before a checkpoint, the export or a weight sync could take them."""
    if parallel.max(int(has_non_finite_weights(model))):
        raise NonFiniteWeightsError(
            f"the {role}'s weights hold NaN or infinity after its update (learning rate {lr:g}): the run stopped "
            f"before saving them; lower {setting}"
        )


def my_micro_batches(
    minibatch: RolloutBatch,
    parallel: DataParallel,
    token_budget: int,
    device: torch.device,
    packed: bool = True,
    share_prompts: bool = False,
    lanes: bool = True,
) -> list[RolloutBatch]:
    """This rank's share of ``minibatch``'s rows in micro-batches of at most ``token_budget`` tokens
    (``RolloutBatch.micro_batch_rows``), padded with loss-free fillers to as many micro-batches as the
    busiest rank has."""
    if not parallel.active:
        return minibatch.micro_batches(token_budget, device, packed, share_prompts, lanes)
    share = minibatch.select(list(parallel.share(len(minibatch))))
    mine = share.micro_batches(token_budget, device, packed, share_prompts, lanes) if len(share) else []
    return parallel.lockstep(mine, minibatch, device)


def epoch_order(rows: int, seed: int, epoch: int) -> list[int]:
    """The order an epoch visits a batch's ``rows`` in (seeded, reshuffled each epoch)."""
    order = list(range(rows))
    random.Random(seed * 1000 + epoch).shuffle(order)
    return order


def shuffled_minibatches(batch: RolloutBatch, size: int, epochs: int, seed: int) -> Iterator[RolloutBatch]:
    """``epochs`` passes over ``batch`` in mini-batches of ``size`` sequences, reshuffled each epoch (seeded)."""
    for epoch in range(epochs):
        order = epoch_order(len(batch), seed, epoch)
        for start in range(0, len(order), size):
            yield batch.select(order[start : start + size])


def first_epoch_row_groups(
    batch: RolloutBatch,
    size: int,
    seed: int,
    parallel: DataParallel,
    token_budget: int,
    packed: bool,
    share_prompts: bool = False,
    lanes: bool = True,
) -> list[list[int]]:
    """The rows of ``batch`` in each micro-batch this rank's update runs in its first epoch (mini-batches of
    ``size`` sequences, as ``shuffled_minibatches`` and ``my_micro_batches`` make them), in its order, then
    empty groups up to the busiest rank's count.  A forward-only pass over these groups lays every row out as
    the update's first forward does (same neighbours, lanes and shapes), so at identical weights the two
    compute a row's log-probs equal to the bit: the first ratio is exactly 1 and a KL to an identical
    reference exactly 0, with its gradient."""
    groups: list[list[int]] = []
    order = epoch_order(len(batch), seed, 0)
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        mine = [rows[i] for i in parallel.share(len(rows))] if parallel.active else rows
        if mine:
            local = batch.select(mine).micro_batch_rows(token_budget, packed, share_prompts, lanes)
            groups += [[mine[i] for i in g] for g in local]
    return groups + [[] for _ in range(parallel.max(len(groups)) - len(groups))]
