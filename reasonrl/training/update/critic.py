"""The critic worker: V(s_t) for a rollout batch, and the clipped value-loss update (docs/algorithms.md, ambiguity 10).

Values are computed the way policy log-probs are: micro-batches of at most ``microbatch_tokens``
padded tokens, bf16 autocast over fp32 weights, the hidden state before each response token.
The critic has its own optimiser and learning rate (VAPO: 2 × the actor's).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from reasonrl.algo.aggregate import count_for_aggregation
from reasonrl.algo.value_loss import explained_variance, value_loss
from reasonrl.batch import FORWARD_TALLY_PREFIXES, ForwardTally, RolloutBatch
from reasonrl.models.forward import runs_in_lanes, weight_casts_kept
from reasonrl.models.optim import apply_gradients
from reasonrl.models.value import ValueModel
from reasonrl.training.placement.parallel import SINGLE_PROCESS, DataParallel, reduce_gradients_after
from reasonrl.training.update.step import my_micro_batches, refuse_non_finite_weights, shuffled_minibatches


class CriticUpdater:
    """Computes values and trains a ``ValueModel`` on a batch's ``returns``."""

    def __init__(
        self,
        model: ValueModel,
        optimizer: torch.optim.Optimizer,
        *,
        value_clip: float | None,
        minibatch_sequences: int,
        epochs: int,
        microbatch_tokens: int,
        grad_clip: float | None,
        compute_dtype: torch.dtype,
        parallel: DataParallel = SINGLE_PROCESS,
        packed: bool = True,  # micro-batches as packed sequences (train.pack_sequences)
        share_prompts: bool = False,  # a prompt several rows share read once (models.forward.prompt_sharing_refusal)
    ) -> None:
        self.model, self.optimizer, self.value_clip, self.packed = model, optimizer, value_clip, packed
        self.share_prompts = packed and share_prompts
        self.minibatch_sequences, self.epochs, self.microbatch_tokens = minibatch_sequences, epochs, microbatch_tokens
        self.grad_clip, self.compute_dtype, self.parallel = grad_clip, compute_dtype, parallel
        self.skipped_steps = 0

    @property
    def lanes(self) -> bool:
        """Whether the value model's packed forwards run in lanes (``models.forward.runs_in_lanes``)."""
        return runs_in_lanes(self.model.backbone.config)

    @property
    def device(self) -> torch.device:
        """Where the model is: each micro-batch moves there."""
        return next(self.model.parameters()).device

    def values(self, batch: RolloutBatch, tally: ForwardTally | None = None) -> torch.Tensor:
        """V(s_t) at every response token of ``batch`` [B, T] (no gradient); 0 where masked.
        Data-parallel: each rank computes its share of the rows, and the ranks sum their results.  Its
        forwards are counted in ``tally``."""
        out = torch.zeros(batch.response_mask.shape)
        with torch.no_grad():
            for rows in self.parallel.row_groups(
                batch, self.microbatch_tokens, self.packed, self.share_prompts, self.lanes
            ):
                part = batch.select(rows or [0])
                if tally is not None:
                    tally.add(
                        part, filler=not rows, packed=self.packed, share_prompts=self.share_prompts, lanes=self.lanes
                    )
                values = self.forward_values(part)
                out[rows, : values.shape[1]] = values.cpu()
        return self.parallel.sum_(out)

    def forward_values(self, part: RolloutBatch) -> torch.Tensor:
        """V(s_t) of a micro-batch [b, T'] (with a gradient when grad mode is on)."""
        return self.model(
            part.prompt_ids,
            part.prompt_mask,
            part.response_ids,
            part.response_mask,
            self.compute_dtype,
            part.vision_inputs(),
            packed=self.packed,
            share_prompts=self.share_prompts,
        )

    def _minibatch_step(self, minibatch: RolloutBatch) -> dict[str, float]:
        mask = minibatch.value_loss_mask
        tokens, seqs = count_for_aggregation(mask)
        sums: dict[str, float] = defaultdict(float)
        micros = my_micro_batches(
            minibatch, self.parallel, self.microbatch_tokens, self.device, self.packed, self.share_prompts, self.lanes
        )
        tally = ForwardTally("critic")
        with weight_casts_kept(self.model):  # until the optimiser step
            for index, micro in enumerate(micros):
                reduce_gradients_after(self.model, last=index == len(micros) - 1)
                tally.add(micro, packed=self.packed, share_prompts=self.share_prompts, lanes=self.lanes)
                values = self.forward_values(micro)
                loss, stats = value_loss(
                    values,
                    micro.values,
                    micro.returns,
                    micro.value_loss_mask,
                    self.value_clip,
                    "token-mean",
                    global_tokens=tokens,
                    global_seqs=seqs,
                )
                loss.backward()
                share = micro.value_loss_mask.sum().item() / max(1, int(tokens))
                sums["critic/value_loss"] += loss.item()
                sums["critic/clip_frac"] += stats["clip_frac"].item() * share
        sums = self.parallel.sum_metrics(sums | tally.metrics())
        grad_norm = apply_gradients(self.model, self.optimizer, self.grad_clip)
        self.skipped_steps += not math.isfinite(grad_norm)
        sums["critic/grad_norm"] = grad_norm
        return dict(sums)

    def update(self, batch: RolloutBatch, seed: int) -> dict[str, float]:
        """All epochs over shuffled mini-batches; needs ``batch.values`` (rollout-time V) and ``batch.returns``.

        Returns metrics averaged over mini-batches, plus the explained variance of the rollout-time
        values against the returns (how well the critic predicted this fresh batch before updating).
        """
        assert batch.values is not None and batch.returns is not None, "compute values and returns first"
        mask = batch.value_loss_mask
        metrics: dict[str, float] = {
            "critic/explained_variance": explained_variance(batch.values, batch.returns, mask).item(),
            "critic/value_mean": (batch.values[mask].mean().item() if mask.any() else math.nan),
            "critic/return_mean": (batch.returns[mask].mean().item() if mask.any() else math.nan),
        }
        if not mask.any():  # T-PPO: no sequence finished this step, so there is nothing to learn from
            metrics["critic/skipped_update"] = 1.0
            return metrics
        # T-PPO's token filtering: sequences still running have no return yet, so no forward is spent on them
        rows = mask.any(dim=1)  # [B]
        trained = batch if rows.all() else batch.select(rows.nonzero().squeeze(1))
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        for minibatch in shuffled_minibatches(trained, self.minibatch_sequences, self.epochs, seed):
            for key, value in self._minibatch_step(minibatch).items():
                totals[key] += value
            steps += 1
        self.model.eval()
        refuse_non_finite_weights(
            self.model, self.parallel, "critic", self.optimizer.param_groups[0]["lr"], "critic.lr"
        )
        metrics |= {k: v if k.startswith(FORWARD_TALLY_PREFIXES) else v / steps for k, v in totals.items()}
        metrics["critic/skipped_steps"] = float(self.skipped_steps)
        return metrics
