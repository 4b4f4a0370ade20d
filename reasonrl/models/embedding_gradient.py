"""The input embedding's gradient summed in fp32 for weights stored in bf16.

The gradient of an embedding lookup adds every occurrence of a token into its row.  torch's CPU kernel adds them in
the weight's dtype: in bf16 a row that many tokens share stops growing once each addition falls below half its
last bit (2,000 occurrences of a gradient of 0.01 sum to 4.0, not 20.0), so the prompts' and the template's frequent
tokens would get a fraction of their gradient.  ``sum_embedding_gradients_in_fp32`` makes a model's lookup add them
in fp32 and round the sum once, as an fp32 weight under autocast (or FSDP2's fp32 gradient reduction) would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class EmbeddingWithFp32GradientSum(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient is summed in fp32 and then cast to the
    weight's dtype (the padding row, if any, gets none: ``F.embedding``'s rule)."""

    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:  # ids [...], weight [V, d]
        ctx.save_for_backward(ids)
        ctx.weight_shape, ctx.weight_dtype, ctx.padding_idx = weight.shape, weight.dtype, padding_idx
        return F.embedding(ids, weight, padding_idx)  # [..., d]

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad [..., d]
        (ids,) = ctx.saved_tensors
        total = torch.zeros(ctx.weight_shape, dtype=torch.float32, device=grad.device)  # [V, d]
        total.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).float())
        if ctx.padding_idx is not None:
            total[ctx.padding_idx] = 0
        return None, total.to(ctx.weight_dtype), None


def sum_embedding_gradients_in_fp32(model: torch.nn.Module) -> bool:
    """Make ``model``'s input embedding sum its weight gradient in fp32 (``EmbeddingWithFp32GradientSum``, through
    a forward hook that replaces the lookup's output) whenever the weight it looks up in is not fp32 (bf16 storage,
    or FSDP2's bf16 all-gather) and is in CPU memory (CUDA's embedding backward sums in fp32 already, and
    deterministically); returns whether the hook is on.  Only a plain ``torch.nn.Embedding`` without
    max_norm, sparse gradients or frequency scaling: a subclass (Gemma's scaled embedding) keeps its own lookup and
    torch's gradient."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    plain = type(embedding) is torch.nn.Embedding and embedding.max_norm is None
    if not plain or embedding.sparse or embedding.scale_grad_by_freq:
        return False

    def lookup_with_fp32_gradient(module: torch.nn.Embedding, inputs: tuple, output: Tensor) -> Tensor | None:
        cpu = module.weight.device.type == "cpu"  # CUDA's kernel sums a bf16 lookup's gradient in fp32 itself
        if module.weight.dtype == torch.float32 or not cpu or not torch.is_grad_enabled():
            return None  # torch's own lookup: fp32 sums already, or no gradient
        return EmbeddingWithFp32GradientSum.apply(inputs[0], module.weight, module.padding_idx)

    embedding.register_forward_hook(lookup_with_fp32_gradient)
    return True
