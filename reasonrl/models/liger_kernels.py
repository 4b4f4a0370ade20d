"""Liger's Triton kernels (liger-kernel, the ``liger`` extra) in the models a run trains: RMSNorm, RoPE and SwiGLU
(``model.kernels``) and the LM head's log-probs by fused linear cross-entropy (``model.logprob_head``).

Layer kernels (``use_liger_layer_kernels``), for the Llama-family decoders transformers implements as
``<Family>RMSNorm``, ``<Family>MLP`` (gate, up and down projections, SiLU) and a module-level
``apply_rotary_pos_emb`` (llama, mistral, qwen2, qwen3):

- each RMSNorm becomes Liger's ``LigerRMSNorm`` holding the same weight (Llama's casting: normalised in fp32, cast
  back to the input's dtype, then scaled) — one kernel forward and one backward instead of five to seven ops;
- each MLP becomes Liger's ``LigerSwiGLUMLP`` holding the same three projections (SiLU(gate)·up in one kernel);
- the RoPE of its attention modules is Liger's ``liger_rotary_pos_emb``.  transformers' attention calls the module
  function ``apply_rotary_pos_emb``, shared by every model of the family in the process; it is wrapped once to call
  Liger's only inside the forward (and a checkpoint's recompute) of an attention module a call here marked, on a
  device Liger's kernels run on, and transformers' own everywhere else (other models, the CPU).  Liger rotates q and
  k in place, so it rotates copies: selective checkpointing keeps the projections' outputs, which an in-place
  rotation would turn twice on recompute.

Modules are replaced, not re-created: the parameters (and a LoRA adapter's wrappers) are the same objects, so
names, optimiser state and checkpoints do not change.  The same call on the policy, the reference and the critic's
backbone keeps their forwards identical.

The head (``fused_linear_logprobs``): log π(y) = −CE(h Wᵀ / T, y) per token from Liger's
``LigerFusedLinearCrossEntropyFunction`` (reduction "none": its backward recomputes the logits chunk by chunk and
folds each token's upstream gradient in before summing the weight's gradient).  h, W and the logits are in the
compute dtype (bf16); the weight's gradient is summed in fp32 and rounded to bf16 once before it reaches an fp32
master weight, as every linear layer's gradient under autocast is (and TRL's Liger path).  It gives no entropy.

Liger's kernels run where Triton runs them: CUDA devices, and CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, which the equality tests use: tests/models/test_liger_kernels.py).
"""

from __future__ import annotations

import contextvars
import importlib
import os

import torch
from torch import Tensor

LIGER_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""model_type values whose decoder layers ``use_liger_layer_kernels`` covers."""


def liger_device(device_type: str) -> bool:
    """Whether Liger's Triton kernels run on tensors of ``device_type``: CUDA, or the CPU under Triton's
    interpreter (TRITON_INTERPRET=1, read when a kernel is defined: set it before liger_kernel is imported)."""
    return device_type == "cuda" or (device_type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def liger_refusal(config) -> str | None:
    """Why Liger's layer kernels cannot run a model of ``config`` (None where they can): a family outside
    ``LIGER_FAMILIES`` or an MLP activation other than SiLU."""
    activation = getattr(config, "hidden_act", None)
    if config.model_type in LIGER_FAMILIES and activation in ("silu", "swish"):
        return None
    return (
        f"Liger's layer kernels cover the {', '.join(LIGER_FAMILIES)} families with SiLU MLPs; this model is "
        f"{config.model_type!r} with {activation!r}"
    )


def _family_module(model_type: str):
    """transformers' modeling module of a covered family (transformers.models.<family>.modeling_<family>)."""
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


_IN_LIGER_ATTENTION = contextvars.ContextVar("in_liger_attention", default=False)
"""True inside the forward of an attention module ``use_liger_layer_kernels`` marked (its recompute included)."""


def _rope_routed(family_rope):
    """``apply_rotary_pos_emb`` that calls Liger's RoPE (on copies of q and k: it rotates in place) inside a marked
    attention module on a Liger device, and ``family_rope`` (the family's own) everywhere else; marked so that a
    second model of the family does not wrap it twice."""
    from liger_kernel.transformers import liger_rotary_pos_emb

    def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1):
        if _IN_LIGER_ATTENTION.get() and liger_device(q.device.type):
            return liger_rotary_pos_emb(q.clone(), k.clone(), cos, sin, unsqueeze_dim=unsqueeze_dim)
        return family_rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.torch_rope = family_rope
    return apply_rotary_pos_emb


def _mark_liger_attention(attention: torch.nn.Module) -> None:
    """Hooks that set ``_IN_LIGER_ATTENTION`` for the module's forward and reset it after (also when it raises)."""

    def enter(module: torch.nn.Module, args: tuple) -> None:
        module.liger_rope_token = _IN_LIGER_ATTENTION.set(True)

    def leave(module: torch.nn.Module, args: tuple, output) -> None:
        _IN_LIGER_ATTENTION.reset(module.__dict__.pop("liger_rope_token"))

    attention.register_forward_pre_hook(enter)
    attention.register_forward_hook(leave, always_call=True)


def use_liger_layer_kernels(model: torch.nn.Module) -> int:
    """Replace ``model``'s RMSNorms and SwiGLU MLPs with Liger's modules over the same parameters and mark its
    attention modules for Liger's RoPE (the module docstring); returns how many modules were replaced or marked.
    ``model`` is a causal LM or a bare decoder of a family in ``LIGER_FAMILIES`` with SiLU activations (else
    ValueError)."""
    from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP

    config = model.config
    refusal = liger_refusal(config)
    if refusal:
        raise ValueError(refusal)
    family = config.model_type
    modeling = _family_module(family)
    own = [v for v in vars(modeling).values() if isinstance(v, type) and v.__module__ == modeling.__name__]
    norm_classes = tuple(c for c in own if c.__name__.endswith("RMSNorm"))  # LlamaRMSNorm, ...
    mlp_classes = tuple(c for c in own if c.__name__.endswith("MLP"))  # LlamaMLP, ...
    attention_classes = tuple(c for c in own if c.__name__.endswith("Attention"))  # LlamaAttention, ...
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in norm_classes:
                with torch.device("meta"):  # the shell only: the weight is the old module's
                    norm = LigerRMSNorm(child.weight.shape[0], eps=child.variance_epsilon, casting_mode="llama")
                norm.weight = child.weight
                setattr(parent, name, norm)
                replaced += 1
            elif type(child) in mlp_classes:
                with torch.device("meta"):
                    mlp = LigerSwiGLUMLP(config, intermediate_size=child.intermediate_size)
                mlp.gate_proj, mlp.up_proj, mlp.down_proj = child.gate_proj, child.up_proj, child.down_proj
                setattr(parent, name, mlp)
                replaced += 1
    for module in model.modules():
        if type(module) in attention_classes:
            _mark_liger_attention(module)
            replaced += 1
    if not hasattr(modeling.apply_rotary_pos_emb, "torch_rope"):
        modeling.apply_rotary_pos_emb = _rope_routed(modeling.apply_rotary_pos_emb)
    return replaced


def fused_linear_logprobs(
    hidden: Tensor,  # [N, d]
    head: torch.nn.Module,  # the LM head: a Linear of weight [V, d]
    targets: Tensor,  # [N] long
    temperature: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """log π(target) [N] fp32 of softmax((W h + b) / T) by Liger's fused linear cross-entropy: the GEMM in
    ``compute_dtype`` chunk by chunk, never [N, V] logits, the weight's gradient summed in fp32 and cast to
    ``compute_dtype`` before it reaches an fp32 master weight (as TRL's Liger path does)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    bias = getattr(head, "bias", None)
    if not len(hidden):
        # no row: Liger's chunking would divide by zero; a zero gradient must still reach W (every rank's does)
        untouched = hidden.sum() + head.weight.sum() + (0 if bias is None else bias.sum())
        return hidden.new_zeros(0, dtype=torch.float32) + 0 * untouched.float()
    inputs = hidden.to(compute_dtype)
    if temperature != 1.0:
        inputs = inputs / temperature  # (W h) / T = W (h / T); the bias is divided below
    if bias is not None:
        bias = bias.to(compute_dtype) / temperature
    losses = liger_fused_linear_cross_entropy(
        inputs, head.weight.to(compute_dtype), targets, bias, reduction="none", accum_dtype=torch.float32
    )  # [N] −log π
    return -losses.float()
