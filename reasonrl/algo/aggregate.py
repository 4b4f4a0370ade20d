"""Loss aggregation: how per-token losses become one scalar (docs/algorithms.md, Conventions 5).

The denominators can be given for the whole optimisation mini-batch (``global_tokens``,
``global_seqs``), so that summing ``aggregate`` over the micro-batches (or data-parallel ranks) of a
mini-batch gives exactly the loss, and the gradient, of one pass over the whole mini-batch.
Averaging per-micro-batch means instead would silently re-weight tokens.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from reasonrl.algo.masked import masked_sum

AggregationMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _at_least_one(count: int | float | Tensor) -> int | float | Tensor:
    """Clamp a denominator to >= 1; an empty numerator is 0, so an empty batch aggregates to 0."""
    return count.clamp(min=1) if isinstance(count, Tensor) else max(count, 1)


def aggregate(
    per_token_loss: Tensor,  # [B, T]
    loss_mask: Tensor,  # [B, T]
    mode: AggregationMode,
    global_tokens: int | Tensor | None = None,
    global_seqs: int | Tensor | None = None,
    constant: float | None = None,
) -> Tensor:
    """Aggregate a masked [B, T] loss into a scalar.

    token-mean               Σ_{i,t} m·L / N_tokens                  DAPO eq 12, VAPO eq 7 (token-level)
    seq-mean-token-mean      (1/|S|) Σ_i [Σ_t m·L / Σ_t m]           GRPO eq 5; VAPO eq 6 (sample-level)
    seq-mean-token-sum       (1/|S|) Σ_i Σ_t m·L                     verl option
    seq-mean-token-sum-norm  (1/|S|) Σ_i Σ_t m·L / C                 Dr. GRPO (arXiv 2503.20783)

    N_tokens = ``global_tokens`` (valid tokens in the whole mini-batch) or, if None, this call's
    valid tokens; |S| = ``global_seqs`` (sequences with at least one valid token in the whole
    mini-batch) or this call's count; fully masked sequences never count in |S| (verl).
    C = ``constant``, or T (this tensor's padded length) if None — pass a fixed constant such as the
    maximum response length for micro-batch invariance.
    Difference from a plain Σ m·L / C (docs/algorithms.md, ambiguity 5): seq-mean-token-sum-norm
    carries the 1/|S| of Dr. GRPO's objective, so its scale does not grow with the batch size.
    Empty inputs aggregate to 0, never NaN.
    """
    mask = loss_mask.bool()
    if mode == "token-mean":
        tokens = mask.sum() if global_tokens is None else global_tokens
        return masked_sum(per_token_loss, mask) / _at_least_one(tokens)
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}")
    seq_tokens = mask.sum(dim=-1)  # [B]
    seq_sums = masked_sum(per_token_loss, mask, dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_losses = seq_sums / seq_tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    else:
        seq_losses = seq_sums / (float(mask.shape[-1]) if constant is None else constant)
    seqs = (seq_tokens > 0).sum() if global_seqs is None else global_seqs
    return seq_losses.sum() / _at_least_one(seqs)


def count_for_aggregation(loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(valid tokens, non-empty sequences) of a mask: the global denominators to pass to ``aggregate``.

    Call it on the whole mini-batch's mask (or sum it over micro-batches / ranks) before the
    per-micro-batch ``aggregate`` calls.  loss_mask: [B, T] -> (scalar, scalar).
    """
    mask = loss_mask.bool()
    return mask.sum(), (mask.sum(dim=-1) > 0).sum()
