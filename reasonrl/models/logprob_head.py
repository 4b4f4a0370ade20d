"""The LM head's log-probability and entropy at chosen tokens, chunk by chunk, never holding [tokens, vocab] logits.

For hidden states h [N, d], the head's weight W [V, d] (and bias b), targets y [N] and temperature T:

    z = (W h + b) / T                       logits over the vocabulary, [N, V]
    log π(y | s) = z_y − logsumexp(z)       the log-probability of each target
    H(π(· | s)) = logsumexp(z) − Σ_v softmax(z)_v · z_v      its entropy

``token_logprobs`` computes both ``chunk_tokens`` rows at a time: the GEMM in the compute dtype (the weight cast
once per call, not per chunk, and kept for the backward pass), the log-sum-exp and everything after it in fp32, and
keeps only three numbers per row (log-prob, entropy, log-sum-exp) for the backward pass, which recomputes each
chunk's logits:

    ∂/∂z  = g_lp · (onehot(y) − p) − g_H · p · (log p + H),     p = softmax(z)
    ∂/∂h  = (∂/∂z) W / T,     ∂/∂W += (∂/∂z)ᵀ h / T (one buffer for the weight),     ∂/∂b += Σ_rows ∂/∂z / T

An entropy nothing back-propagates (an entropy coefficient of 0: its gradient is None) costs no backward work.
Each chunk takes one exponential pass forward and one backward, in place where it can (``_chunk_statistics``,
``_chunk_logit_gradient``): on the project's 2-core CPU a [400, 49152] chunk of SmolLM2's head took 158 ms forward
and 482 ms forward + backward against 208 and 643 ms with a separate log-sum-exp, softmax and product (2026-11-29).
Against a plain ``log_softmax`` of the whole [N, V] logits: equal in fp32 to 1e-5, log-probs, entropy and the
gradients of h, W and b (tests/models/test_logprob_head.py).  Peak memory: a chunk's [chunk, V] fp32 logits and
their softmax, where the plain path holds several [N, V] tensors for its backward.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

DEFAULT_CHUNK_TOKENS = 512


class _ChunkScratch:
    """The [chunk, V] tensors a call's chunks write, reused chunk after chunk, and the [V, d] buffer of the
    weight gradient's per-chunk products: each fresh block this large costs its memory's first touch (on the CPU,
    glibc maps every block above 32 MiB anew: page faults and zeroing, about a third of the head's time in a
    2-core profile).  On the CPU one set serves every call of a thread on the same weight (``_scratch_for``)."""

    def __init__(self, rows: int, weight: Tensor) -> None:
        vocab, device = weight.shape[0], weight.device
        self.rows, self.dtype = rows, weight.dtype
        self.logits = torch.empty(rows, vocab, dtype=torch.float32, device=device)  # z, then log p
        self.exp = torch.empty(rows, vocab, dtype=torch.float32, device=device)  # exp(z − m), then p
        # the GEMM's output in the compute dtype, then the logits' gradient cast to it (fp32: the logits themselves)
        self.compute = self.logits if weight.dtype == torch.float32 else torch.empty_like(self.exp, dtype=weight.dtype)
        self.weight_part: Tensor | None = None  # [V, d] compute dtype: one chunk's weight gradient (backward only)

    def fits(self, rows: int, weight: Tensor) -> bool:
        """Whether a call of ``rows`` chunk rows on ``weight`` (its compute-dtype cast) can use these tensors."""
        return rows <= self.rows and weight.dtype == self.dtype and weight.shape[0] == self.logits.shape[1]


_CPU_SCRATCH = threading.local()  # per thread: {weight: _ChunkScratch}, kept while the weight lives


def _scratch_for(rows: int, weight: Tensor, weight_c: Tensor) -> _ChunkScratch:
    """The scratch of a call on ``weight`` (cast to the compute dtype: ``weight_c``): on the CPU, this thread's
    kept one for ``weight`` where it fits (made and kept otherwise); elsewhere a fresh one (CUDA's caching
    allocator reuses blocks itself).  Nothing a backward pass needs is in it: calls never read another's."""
    if weight.device.type != "cpu":
        return _ChunkScratch(rows, weight_c)
    kept = getattr(_CPU_SCRATCH, "by_weight", None)
    if kept is None:
        kept = _CPU_SCRATCH.by_weight = WeakIdKeyDictionary()
    scratch = kept.get(weight)
    if scratch is None or not scratch.fits(rows, weight_c):
        scratch = kept[weight] = _ChunkScratch(rows, weight_c)
    return scratch


def _chunk_logits(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    temperature: float,
    suppressed: tuple[int, ...],
    scratch: _ChunkScratch,
) -> Tensor:
    """z = (h Wᵀ + b) / T for one chunk [n, d] -> [n, V] fp32 (in ``scratch``), suppressed tokens out of the
    distribution (−inf-like)."""
    n = hidden.shape[0]
    logits = scratch.logits[:n]
    product = torch.mm(hidden, weight.T, out=scratch.compute[:n])  # [n, V]: the GEMM in the compute dtype
    if product.data_ptr() != logits.data_ptr():
        logits.copy_(product)  # accumulated to fp32
    if bias is not None:
        logits += bias.float()
    if temperature != 1.0:
        logits /= temperature
    if suppressed:
        logits[:, list(suppressed)] = torch.finfo(logits.dtype).min
    return logits


def _chunk_statistics(logits: Tensor, targets: Tensor, scratch: _ChunkScratch) -> tuple[Tensor, Tensor, Tensor]:
    """(logsumexp(z), log π(y), H) [n] of one chunk's fp32 logits z [n, V], which it overwrites (z − max z).

    One exponential pass: with m = max z, e = exp(z − m) and s = Σ e, logsumexp(z) = m + log s,
    log π(y) = (z_y − m) − log s and H = log s − Σ e (z − m) / s (a batched dot product, no [n, V] product)."""
    peak = logits.amax(-1, keepdim=True)  # [n, 1]
    shifted = logits.sub_(peak)  # [n, V] z − m, in place
    exp = torch.exp(shifted, out=scratch.exp[: len(shifted)])  # [n, V]
    total = exp.sum(-1)  # [n]
    log_total = total.log()
    weighted = torch.bmm(exp[:, None, :], shifted[:, :, None]).view(-1)  # [n] Σ e (z − m)
    target_shifted = shifted.gather(-1, targets[:, None]).squeeze(-1)
    return peak.squeeze(-1) + log_total, target_shifted - log_total, log_total - weighted / total


def _chunk_logit_gradient(
    logits: Tensor,  # [n, V] fp32, overwritten
    normaliser: Tensor,  # [n] logsumexp(z)
    targets: Tensor,  # [n]
    grad_logprobs: Tensor | None,  # [n] g_lp
    grad_entropy: tuple[Tensor, Tensor] | None,  # ([n] g_H, [n] H)
    scratch: _ChunkScratch,
) -> Tensor:
    """∂/∂z [n, V] = g_lp · (onehot(y) − p) − g_H · p · (log p + H), p = softmax(z), in ``logits``' storage:
    log p in place, p in ``scratch``, the bracket's factor built in place of log p."""
    log_p = logits.sub_(normaliser[:, None])  # [n, V] log p, in place
    p = torch.exp(log_p, out=scratch.exp[: len(log_p)])  # [n, V]
    if grad_entropy is None:  # −g_lp · p
        grad_logits = p.mul_(-grad_logprobs[:, None])
    else:  # −p · (g_lp + g_H (log p + H)), g_lp = 0 without log-prob gradient
        g_entropy, entropy = grad_entropy
        factor = log_p.add_(entropy[:, None]).mul_(g_entropy[:, None])  # [n, V] g_H (log p + H)
        if grad_logprobs is not None:
            factor.add_(grad_logprobs[:, None])
        grad_logits = factor.mul_(p).neg_()
    if grad_logprobs is not None:  # + g_lp at each target
        grad_logits.scatter_add_(-1, targets[:, None], grad_logprobs[:, None])
    return grad_logits


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
        scratch = _scratch_for(min(n, chunk_tokens), weight, weight_c)
        for start in range(0, n, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            logits = _chunk_logits(hidden[rows].to(compute_dtype), weight_c, bias_c, temperature, suppressed, scratch)
            lse, logprobs[rows], entropy[rows] = _chunk_statistics(logits, targets[rows], scratch)
            normaliser[rows] = lse
        ctx.save_for_backward(hidden, weight_c, bias, targets, normaliser, entropy)  # the weight's cast, not cast again
        ctx.options = (temperature, suppressed, chunk_tokens, compute_dtype, weight.dtype)
        ctx.weight = weight  # the key of its kept scratch (not saved: the backward pass reads weight_c)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight_c, bias, targets, normaliser, entropy = ctx.saved_tensors
        temperature, suppressed, chunk_tokens, compute_dtype, weight_dtype = ctx.options
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 8
        bias_c = None if bias is None else bias.to(compute_dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None  # fp32 [V, d]: the first chunk's product, the later ones added to it
        wants_bias = bias is not None and ctx.needs_input_grad[2]
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if wants_bias else None
        scratch = _scratch_for(min(len(hidden), chunk_tokens), ctx.weight, weight_c)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            hidden_c = hidden[rows].to(compute_dtype)
            logits = _chunk_logits(hidden_c, weight_c, bias_c, temperature, suppressed, scratch)
            grad_logits = _chunk_logit_gradient(
                logits,
                normaliser[rows],
                targets[rows],
                None if grad_logprobs is None else grad_logprobs[rows],
                None if grad_entropy is None else (grad_entropy[rows], entropy[rows]),
                scratch,
            )
            if temperature != 1.0:
                grad_logits /= temperature
            if suppressed:
                grad_logits[:, list(suppressed)] = 0.0
            grad_logits_c = scratch.compute[: len(grad_logits)].copy_(grad_logits)  # the compute dtype (fp32: itself)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_logits_c @ weight_c).to(hidden.dtype)
            if ctx.needs_input_grad[1]:  # [V, d] in the compute dtype, then summed in fp32
                part = scratch.weight_part = torch.mm(grad_logits_c.T, hidden_c, out=scratch.weight_part)
                grad_weight = part.to(torch.float32, copy=True) if grad_weight is None else grad_weight.add_(part)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        if ctx.needs_input_grad[1] and grad_weight is None:  # no row: a zero gradient, as every rank's must exist
            grad_weight = torch.zeros_like(weight_c, dtype=torch.float32)
        grad_weight = None if grad_weight is None else grad_weight.to(weight_dtype)
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
