"""What gradient checkpointing keeps for the backward pass and what it computes again (model.checkpoint_policy).

Gradient checkpointing runs each decoder layer without keeping its activations and recomputes the layer in the
backward pass.  ``full`` (transformers' own) keeps only each layer's input and recomputes everything: about a third
more compute for the whole step, most of it the layers' matmuls again.  ``selective`` keeps the outputs of the
operations that cost compute (every matmul: the q/k/v/o and MLP projections, and attention itself) and recomputes
only what is cheap to compute and costly to keep: norms, RoPE, the MLP's activation and product, residual adds and
autocast's casts.  That is torch's selective activation checkpointing (``create_selective_checkpoint_contexts``),
as torchtitan's op-level policy uses it (it keeps every matmul here; torchtitan every other one).

Memory per token and layer (``models.memory_plan``): ``full`` keeps the layer's input; ``selective`` that and the
matmul outputs, 4·d + 2·kv + 2·I values in the compute dtype (d the hidden size, kv the key/value width, I the
MLP's), a third or so of what a layer keeps without checkpointing under bf16 autocast.  Both compute the same
gradients as no checkpointing (tests/models/test_checkpointing.py).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

CheckpointPolicyName = Literal["full", "selective"]

KEPT_MATMULS = ("mm", "addmm", "bmm", "baddbmm")
"""aten matmuls whose outputs ``selective`` keeps."""
KEPT_ATTENTION_WORDS = ("attention", "attn")
"""Words naming an attention kernel whose output ``selective`` keeps: sdpa's flash, efficient, cuDNN and CPU
kernels, flash-attn's and torch's variable-length ones."""


def keeps_output(operation) -> bool:
    """Whether ``selective`` keeps ``operation``'s output (a matmul's or an attention kernel's) rather than
    computing it again."""
    name = str(getattr(operation, "__name__", operation)).split(".")[0].lower().lstrip("_")
    return name in KEPT_MATMULS or any(word in name for word in KEPT_ATTENTION_WORDS)


def _selective_policy(ctx, operation, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if keeps_output(operation) else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointing_arguments(policy: CheckpointPolicyName) -> dict:
    """``torch.utils.checkpoint.checkpoint``'s keyword arguments for ``policy`` (transformers passes them on)."""
    if policy == "full":
        return {"use_reentrant": False}
    contexts = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
    return {"use_reentrant": False, "context_fn": contexts}


def enable_checkpointing(model: torch.nn.Module, policy: CheckpointPolicyName) -> None:
    """Turn on gradient checkpointing of ``model``'s decoder layers (a transformers model) with ``policy``."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_arguments(policy))
