"""Token sampling shared by the engines: temperature, top-k, top-p, and FIRE's flaming-hot first tokens.

FIRE (Chen et al. 2024, arXiv:2410.21236): the tokens at ``positions`` (default: the
first response token) are sampled from top-k(softmax(z / T_fire)) with a very high temperature
(authors' implementation: 30, top-k 16), every later token with the regular settings.  The FIRE
parameters are built last, so the regular temperature/top-k never override them (docs/algorithms.md, FIRE sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from reasonrl.config.rollout_schema import FireConfig

FIRE = FireConfig()  # the defaults: one source, the config schema


@dataclass(frozen=True)
class FireParams:
    """Flaming-hot sampling for a few response positions (the fields of ``FireConfig``)."""

    temperature: float = FIRE.temperature
    """Temperature of the FIRE positions."""

    top_k: int = FIRE.top_k
    """Top-k of the FIRE positions."""

    positions: tuple[int, ...] = FIRE.positions
    """Response positions (0 = the first generated token) sampled flaming-hot."""


def fire_params(fire: FireConfig) -> FireParams | None:
    """The sampling parameters of a FIRE config, or None when FIRE is off."""
    return FireParams(fire.temperature, fire.top_k, fire.positions) if fire.enabled else None


def filtered_logits(logits: Tensor, temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """logits / T restricted to the top-k tokens, then to the smallest set whose probability reaches
    top_p (-inf elsewhere).  Temperature 0 (greedy) leaves the logits as they are.  [B, V] -> [B, V] fp32."""
    scaled = logits.float()
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    if temperature > 0 and top_k is not None and 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]  # [B, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if temperature > 0 and top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        beyond = probs.cumsum(-1) - probs > top_p  # the first token is always kept
        scaled = scaled.scatter(-1, order, ordered.masked_fill(beyond, float("-inf")))
    return scaled


def sampling_logprobs(logits: Tensor, temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """Log-probabilities of the distribution tokens are drawn from (renormalised after filtering)."""
    return torch.log_softmax(filtered_logits(logits, temperature, top_k, top_p), dim=-1)


def draw(scaled: Tensor, greedy: bool, uniforms: Tensor, block: int = 256) -> tuple[Tensor, Tensor]:
    """One token per row from filtered logits [B, V] and one uniform in [0, 1) per row ``uniforms``
    [B]; returns (tokens [B], their log-probs [B]).

    Inverse-CDF sampling with one uniform per row (far cheaper than exponential/Gumbel noise over
    the vocabulary; each row's draw depends on its own uniform only), in two levels: pick a block of
    ``block`` tokens by its total probability, then
    a token inside it, so no full-vocabulary cumulative sum is needed.
    """
    probs = torch.softmax(scaled, dim=-1)  # [B, V]
    if greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        rows, vocab = probs.shape
        padded = F.pad(probs, (0, -vocab % block)).view(rows, -1, block)  # [B, blocks, block]
        block_cdf = padded.sum(-1).cumsum(-1)  # [B, blocks]
        target = uniforms.to(probs.dtype)[:, None] * block_cdf[:, -1:]
        chosen = torch.searchsorted(block_cdf, target).clamp(max=block_cdf.shape[1] - 1)  # [B, 1]
        before = torch.where(chosen > 0, block_cdf.gather(1, (chosen - 1).clamp(min=0)), torch.zeros_like(target))
        inner_cdf = padded.gather(1, chosen[:, :, None].expand(rows, 1, block)).squeeze(1).cumsum(-1)  # [B, block]
        inner = torch.searchsorted(inner_cdf, target - before).clamp(max=block - 1)
        tokens = (chosen * block + inner).squeeze(-1).clamp(max=vocab - 1)
        impossible = probs.gather(1, tokens[:, None]).squeeze(-1) <= 0  # a float-rounding edge case
        if bool(impossible.any()):
            tokens = torch.where(impossible, probs.argmax(-1), tokens)
    return tokens, probs.gather(1, tokens[:, None]).squeeze(-1).log()


def sample_tokens(
    logits: Tensor,  # [B, V]
    temperature: float,
    top_k: int | None,
    top_p: float,
    uniforms: Tensor,  # [B] one uniform in [0, 1) per row
    fire_rows: Tensor | None = None,  # [B] bool: rows at a FIRE position
    fire: FireParams | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row; rows flagged ``fire_rows`` use the FIRE parameters instead.

    Returns (tokens [B], log-probs [B] under the distribution each token was drawn from).
    """
    tokens, token_logprobs = draw(filtered_logits(logits, temperature, top_k, top_p), temperature <= 0, uniforms)
    if fire is not None and fire_rows is not None and bool(fire_rows.any()):
        rows = fire_rows.nonzero().squeeze(-1)
        hot = filtered_logits(logits[rows], fire.temperature, fire.top_k, 1.0)
        hot_tokens, hot_logprobs = draw(hot, False, uniforms[rows])
        tokens = tokens.index_copy(0, rows, hot_tokens)
        token_logprobs = token_logprobs.index_copy(0, rows, hot_logprobs)
    return tokens, token_logprobs
