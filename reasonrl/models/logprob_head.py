"""The LM head's log-probability and entropy at chosen tokens, chunk by chunk, never holding [tokens, vocab] logits.

For hidden states h [N, d], the head's weight W [V, d] (and bias b), targets y [N] and temperature T:

    z = (W h + b) / T                       logits over the vocabulary, [N, V]
    log π(y | s) = z_y − logsumexp(z)       the log-probability of each target
    H(π(· | s)) = logsumexp(z) − Σ_v softmax(z)_v · z_v      its entropy

``token_logprobs`` computes both ``chunk_tokens`` rows at a time: the GEMM in the compute dtype (the weight cast
once per call, not per chunk), the log-sum-exp and everything after it in fp32, and keeps only three numbers per
row (log-prob, entropy, log-sum-exp) for the backward pass, which recomputes each chunk's logits:

    ∂/∂z  = g_lp · (onehot(y) − p) − g_H · p · (log p + H),     p = softmax(z)
    ∂/∂h  = (∂/∂z) W / T,     ∂/∂W += (∂/∂z)ᵀ h / T (one buffer for the weight),     ∂/∂b += Σ_rows ∂/∂z / T

An entropy nothing back-propagates (an entropy coefficient of 0: its gradient is None) costs no backward work.
Against a plain ``log_softmax`` of the whole [N, V] logits: equal in fp32 to 1e-5, log-probs, entropy and the
gradients of h, W and b (tests/models/test_logprob_head.py).  Peak memory: a chunk's [chunk, V] fp32 logits and
their softmax, where the plain path holds several [N, V] tensors for its backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_CHUNK_TOKENS = 512


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, suppressed: tuple[int, ...]
) -> Tensor:
    """z = (h Wᵀ + b) / T for one chunk [n, d] -> [n, V] fp32, suppressed tokens out of the distribution (−inf-like)."""
    logits = (hidden @ weight.T).float()  # [n, V]: the GEMM in the compute dtype, accumulated to fp32
    if bias is not None:
        logits += bias.float()
    if temperature != 1.0:
        logits /= temperature
    if suppressed:
        logits[:, list(suppressed)] = torch.finfo(logits.dtype).min
    return logits


class _ChunkedLogprobs(torch.autograd.Function):
    """``token_logprobs`` as an autograd function (the module docstring's forward and backward)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, suppressed, chunk_tokens, compute_dtype):
        ctx.set_materialize_grads(False)  # an output nothing reads gets no gradient, and costs no backward work
        weight_c = weight.to(compute_dtype)  # once per call
        bias_c = None if bias is None else bias.to(compute_dtype)
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logprobs)
        normaliser = torch.empty_like(logprobs)
        for start in range(0, n, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            logits = _chunk_logits(hidden[rows].to(compute_dtype), weight_c, bias_c, temperature, suppressed)
            lse = torch.logsumexp(logits, dim=-1)  # [n]
            normaliser[rows] = lse
            logprobs[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - lse
            entropy[rows] = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, normaliser, entropy)
        ctx.options = (temperature, suppressed, chunk_tokens, compute_dtype)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, normaliser, entropy = ctx.saved_tensors
        temperature, suppressed, chunk_tokens, compute_dtype = ctx.options
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 8
        weight_c = weight.to(compute_dtype)
        bias_c = None if bias is None else bias.to(compute_dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        wants_bias = bias is not None and ctx.needs_input_grad[2]
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if wants_bias else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            hidden_c = hidden[rows].to(compute_dtype)
            logits = _chunk_logits(hidden_c, weight_c, bias_c, temperature, suppressed)
            log_p = logits - normaliser[rows, None]  # [n, V]
            p = log_p.exp()
            grad_logits = torch.zeros_like(logits)
            if grad_logprobs is not None:  # g_lp · (onehot(y) − p)
                g = grad_logprobs[rows, None]
                grad_logits -= g * p
                grad_logits.scatter_add_(-1, targets[rows, None], g)
            if grad_entropy is not None:  # − g_H · p · (log p + H)
                grad_logits -= grad_entropy[rows, None] * p * (log_p + entropy[rows, None])
            if temperature != 1.0:
                grad_logits /= temperature
            if suppressed:
                grad_logits[:, list(suppressed)] = 0.0
            grad_logits_c = grad_logits.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_logits_c @ weight_c).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (grad_logits_c.T @ hidden_c).float()
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def token_logprobs(
    hidden: Tensor,  # [N, d]
    head: torch.nn.Module,  # the LM head: a Linear of weight [V, d]
    targets: Tensor,  # [N] long
    temperature: float = 1.0,
    suppressed: tuple[int, ...] = (),
    compute_dtype: torch.dtype = torch.float32,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[Tensor, Tensor]:
    """(log π(target) [N], entropy [N]), fp32, of softmax((W h + b) / T) (the module docstring); ``suppressed``
    tokens are out of the distribution (the engine never samples them).  Gradients flow into ``hidden`` and the
    head's weight (and bias) when grad mode is on."""
    return _ChunkedLogprobs.apply(
        hidden, head.weight, getattr(head, "bias", None), targets, temperature, suppressed, chunk_tokens, compute_dtype
    )
