"""One packed sequence on a GPU without flash-attn: torch's variable-length flash attention
(``torch.nn.attention.varlen.varlen_attn``, CUDA, torch >= 2.10) registered with transformers'
``AttentionInterface`` as ``model.attention=varlen``.

A packed micro-batch is one sequence [1, N] of segments (rows); each segment attends causally to itself only.
The segments' cumulative lengths ``cu_seq_lens`` [S+1] are computed once per forward (``response_hidden_states``)
and reach every layer as transformers' flash-attention keyword arguments (``cu_seq_lens_q``, ``max_length_q``);
no [N, N] block mask is ever built: inside ``packed_varlen_forward()`` the registered mask function returns None.
Every other call (a padded batch, ``generate`` with its left padding and KV cache, a vision tower) runs
transformers' SDPA with SDPA's mask, so the name is safe wherever the model goes.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect

import torch
from torch import Tensor

from reasonrl.config import ConfigError

VARLEN_ATTENTION = "reasonrl_varlen"
"""The name the attention function and its mask function are registered under in transformers."""

_packed_call = contextvars.ContextVar("reasonrl_packed_varlen_call", default=False)


# Architectures whose packed forward with ``varlen`` equals the padded one (tests/models/test_varlen_attention.py:
# log-probs, entropy and gradients to 1e-5 with the kernel's CPU stand-in, a tiny random config each): the
# packing-verified text architectures (``models.forward.PACKING_VERIFIED``) whose attention goes through
# transformers' ``AttentionInterface`` (Falcon, Nemotron and StableLM pick their own attention classes).
VARLEN_VERIFIED = frozenset({
    "apertus", "arcee", "bitnet", "cohere", "cohere2", "ernie4_5", "exaone4", "gemma", "gemma2", "gemma3_text",
    "glm", "glm4", "gpt2", "gpt_neox", "granite", "granitemoe", "helium", "hunyuan_v1_dense", "llama", "ministral",
    "mistral", "mixtral", "olmo", "olmo2", "olmo3", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "seed_oss", "smollm3", "starcoder2",
})  # fmt: skip


def varlen_refusal(config) -> str | None:
    """Why a model with this transformers ``config`` cannot read packed rows with ``varlen`` (None: it can):
    an architecture of ``VARLEN_VERIFIED`` whose every layer is plain causal attention (no sliding window,
    chunked layer or logit soft-capping)."""
    model_type = getattr(config, "model_type", None)
    kinds = getattr(config, "layer_types", None)
    if model_type not in VARLEN_VERIFIED:
        return f"it is not verified for the '{model_type}' architecture"
    if kinds and any("sliding" in str(kind) or "chunked" in str(kind) for kind in kinds):
        return "the model has sliding-window or chunked layers"
    if not kinds and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model has a sliding window"
    if getattr(config, "attn_logit_softcapping", None):
        return "the model soft-caps its attention logits"
    return None


def transformers_attention(name: str | None, model=None) -> str | None:
    """transformers' ``attn_implementation`` for reasonrl's ``model.attention`` value ``name``: ``varlen`` is
    registered (once) and named ``VARLEN_ATTENTION``, for a ``model`` (its config, or where to read one) that
    ``varlen_refusal`` accepts (a ConfigError naming why otherwise); every other name is transformers' own."""
    if name != "varlen":
        return name
    from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig, PretrainedConfig

    config = model if isinstance(model, PretrainedConfig) else AutoConfig.from_pretrained(str(model))
    if reason := varlen_refusal(config):
        raise ConfigError(f"model.attention=varlen cannot run for {model if config is not model else 'this model'}: "
                          f"{reason}; use sdpa")  # fmt: skip
    if VARLEN_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
        AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_mask)
    return VARLEN_ATTENTION


def varlen_mask(*args, **kwargs):
    """transformers' mask function for ``VARLEN_ATTENTION``: none inside ``packed_varlen_forward()``, SDPA's
    mask everywhere else."""
    from transformers.masking_utils import sdpa_mask

    return None if _packed_call.get() else sdpa_mask(*args, **kwargs)


@contextlib.contextmanager
def packed_varlen_forward():
    """Within it, a model with the ``varlen`` attention builds no attention mask: the caller passes each layer
    the segments' ``cu_seq_lens_q`` (``segment_boundaries``) instead."""
    token = _packed_call.set(True)
    try:
        yield
    finally:
        _packed_call.reset(token)


def segment_boundaries(segment_lengths: list[int], device: torch.device) -> dict:
    """transformers' flash-attention keyword arguments for one sequence of segments of ``segment_lengths``:
    the cumulative lengths [S+1] (int32) and the longest segment, the same for queries and keys."""
    cumulative = torch.tensor([0, *segment_lengths], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    longest = max(segment_lengths)
    return {"cu_seq_lens_q": cumulative, "cu_seq_lens_k": cumulative, "max_length_q": longest, "max_length_k": longest}


def varlen_attention_forward(
    module: torch.nn.Module,
    query: Tensor,  # [1, H, N, D]
    key: Tensor,  # [1, Hkv, N, D]
    value: Tensor,  # [1, Hkv, N, D]
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: causal attention within each segment of one packed
    sequence, output [1, N, H, D].  Without ``cu_seq_lens_q`` (not a packed reasonrl forward) it is SDPA."""
    boundaries = kwargs.get("cu_seq_lens_q")
    if boundaries is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("model.attention=varlen reads plain causal attention only (no window, no soft-capping)")
    if query.shape[0] != 1:
        raise ValueError(f"model.attention=varlen reads one packed sequence [1, N], got a batch of {query.shape[0]}")
    dtype = query.dtype
    if query.is_cuda and dtype == torch.float32:  # the kernel takes half types; RoPE may hand back fp32
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
    # [1, H, N, D] -> [N, H, D]
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    output = varlen_kernel(q, k, v, boundaries, int(kwargs["max_length_q"]), scaling)  # [N, H, D]
    return output.to(query.dtype)[None], None  # [1, N, H, D]


def varlen_kernel(query: Tensor, key: Tensor, value: Tensor, boundaries: Tensor, longest: int,
                  scale: float | None) -> Tensor:  # fmt: skip
    """torch's ``varlen_attn``, causal, over [N, H, D] queries and [N, Hkv, D] keys and values; [N, H, D].  Its
    signature changed across torch versions: causal by ``is_causal`` (2.10) or ``window_size=(-1, 0)`` (later), the
    scale given (later) or folded into the queries (2.10: no ``scale``, always 1/√D), grouped-query heads shared
    natively (``enable_gqa``, later) or repeated."""
    from torch.nn.attention.varlen import varlen_attn

    accepted = inspect.signature(varlen_attn).parameters
    options: dict = {}
    if "is_causal" in accepted:
        options["is_causal"] = True
    else:
        options["window_size"] = (-1, 0)
    if scale is not None and "scale" in accepted:
        options["scale"] = scale
    elif scale is not None and abs(scale * query.shape[-1] ** 0.5 - 1) > 1e-6:  # the kernel scales by 1/√D
        query = query * (scale * query.shape[-1] ** 0.5)  # the rest folded into the queries
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and "enable_gqa" in accepted:
        options["enable_gqa"] = True
    elif groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, boundaries, boundaries, longest, longest, **options)
