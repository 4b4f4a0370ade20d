"""One packed sequence through every layer, registered with transformers' ``AttentionInterface``:

- ``model.attention=varlen`` (a GPU without flash-attn): torch's variable-length flash attention
  (``torch.nn.attention.varlen.varlen_attn``, CUDA, torch >= 2.10).  A packed micro-batch is one sequence [1, N] of
  segments (rows); each segment attends causally to itself only.  The segments' cumulative lengths ``cu_seq_lens``
  [S+1] are computed once per forward (``response_hidden_states``) and reach every layer as transformers'
  flash-attention keyword arguments (``cu_seq_lens_q``, ``max_length_q``).
- ``model.attention=lanes`` (the CPU, which has no variable-length kernel): the projections, norms, RoPE and MLP
  read the N tokens alone; attention alone places them in lanes [L, W] as wide as the longest segment (a row, or a
  prompt with the responses that share it) and back (``LaneLayout``, passed to every layer as ``lane_layout``),
  under the segments' [L, 1, W, W] mask: eager's matmul and softmax for lanes up to ``EAGER_ATTENTION_MAX_TOKENS``
  (512) wide, SDPA above.  Every op but attention then computes no lane padding.

No [N, N] mask is ever built: inside ``packed_varlen_forward()`` the registered mask function returns None.
Every other call (a padded batch, ``generate`` with its left padding and KV cache, a vision tower) runs
transformers' SDPA with SDPA's mask, so the names are safe wherever the model goes.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from reasonrl.config import ConfigError
from reasonrl.config.plan import EAGER_ATTENTION_MAX_TOKENS

VARLEN_ATTENTION = "reasonrl_varlen"
"""The name the varlen attention function and its mask function are registered under in transformers."""

LANE_ATTENTION = "reasonrl_lanes"
"""The name the lanes attention function and its mask function are registered under in transformers."""

logger = logging.getLogger(__name__)

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
    """transformers' ``attn_implementation`` for reasonrl's ``model.attention`` value ``name``: ``varlen`` and
    ``lanes`` are registered (once) and named ``VARLEN_ATTENTION`` and ``LANE_ATTENTION``, for a ``model`` (its
    config, or where to read one) that ``varlen_refusal`` accepts: otherwise varlen is a ConfigError naming why and
    lanes falls back to None, transformers' default for the model (sdpa where it has it, else eager; logged); every
    other name is transformers' own."""
    if name not in ("varlen", "lanes"):
        return name
    from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig, PretrainedConfig

    config = model if isinstance(model, PretrainedConfig) else AutoConfig.from_pretrained(str(model))
    if (reason := varlen_refusal(config)) and name == "lanes":
        logger.info("model.attention=lanes runs transformers' default attention for this model: %s", reason)
        return None
    if reason:
        raise ConfigError(f"model.attention=varlen cannot run for {model if config is not model else 'this model'}: "
                          f"{reason}; use sdpa")  # fmt: skip
    registered, function = (
        (VARLEN_ATTENTION, varlen_attention_forward) if name == "varlen" else (LANE_ATTENTION, lane_attention_forward)
    )
    if registered not in AttentionInterface._global_mapping:
        AttentionInterface.register(registered, function)
        AttentionMaskInterface.register(registered, varlen_mask)
    return registered


def varlen_mask(*args, **kwargs):
    """transformers' mask function for ``VARLEN_ATTENTION`` and ``LANE_ATTENTION``: none inside
    ``packed_varlen_forward()``, SDPA's mask everywhere else."""
    from transformers.masking_utils import sdpa_mask

    return None if _packed_call.get() else sdpa_mask(*args, **kwargs)


@contextlib.contextmanager
def packed_varlen_forward():
    """Within it, a model with the ``varlen`` or ``lanes`` attention builds no attention mask: the caller passes
    each layer the segments' ``cu_seq_lens_q`` (``segment_boundaries``) or their ``lane_layout`` instead."""
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


def packed_only(name: str, marker: str, attend: Callable[..., Tensor]) -> Callable[..., tuple[Tensor, None]]:
    """A function of transformers' attention-function contract (queries [1, H, N, D], keys and values [1, Hkv, N, D]
    -> [1, N, H, D], None) that runs ``attend(query, key, value, scaling, kwargs)`` where a packed reasonrl forward
    passed its keyword argument ``marker``, and transformers' SDPA everywhere else; ``name``: model.attention's."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if kwargs.get(marker) is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        if kwargs.get("sliding_window") or kwargs.get("softcap"):
            raise ValueError(f"model.attention={name} reads plain attention only (no window, no soft-capping)")
        if query.shape[0] != 1:
            raise ValueError(f"model.attention={name} reads one packed sequence [1, N], not a batch of {len(query)}")
        return attend(query, key, value, scaling, kwargs), None

    return attention


def _varlen_segments(query: Tensor, key: Tensor, value: Tensor, scaling: float | None, kwargs: dict) -> Tensor:
    """Causal attention within each segment of one packed sequence (``cu_seq_lens_q``): [1, N, H, D]."""
    dtype = query.dtype
    if query.is_cuda and dtype == torch.float32:  # the kernel takes half types; RoPE may hand back fp32
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
    # [1, H, N, D] -> [N, H, D]
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    output = varlen_kernel(q, k, v, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]), scaling)  # [N, H, D]
    return output.to(query.dtype)[None]  # [1, N, H, D]


varlen_attention_forward = packed_only("varlen", "cu_seq_lens_q", _varlen_segments)


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


@dataclass(frozen=True)
class LaneLayout:
    """Where the N tokens of one packed sequence sit in lanes [L, W] for ``lane_attention_forward``, and which
    attend to which."""

    places: Tensor
    """[N] long, ascending: each token's place in the lanes, lane × W + column."""
    mask: Tensor
    """[L, 1, W, W] bool: True where a query (dim 2) attends to a key (dim 3); every place attends to itself."""


def _attend_in_lanes(query: Tensor, key: Tensor, value: Tensor, scaling: float | None, kwargs: dict) -> Tensor:
    """Attention over the tokens of one packed sequence placed in lanes by ``lane_layout`` (the module
    docstring): [1, N, H, D]."""
    layout: LaneLayout = kwargs["lane_layout"]
    if query.shape[2] != len(layout.places):
        raise ValueError(f"model.attention=lanes reads one packed sequence of {len(layout.places)} tokens, "
                         f"got {query.shape[2]}")  # fmt: skip
    lanes, _, width, _ = layout.mask.shape
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5

    def in_lanes(states: Tensor) -> Tensor:  # [1, h, N, D] -> [L, h, W, D]
        heads, dim = states.shape[1], states.shape[3]
        placed = states.new_zeros(lanes * width, heads, dim).index_copy(0, layout.places, states[0].transpose(0, 1))
        return placed.view(lanes, width, heads, dim).transpose(1, 2).contiguous()

    q, k, v = in_lanes(query), in_lanes(key), in_lanes(value)
    if width <= EAGER_ATTENTION_MAX_TOKENS:  # eager beats SDPA there (config.plan.attention_implementation)
        output = _eager_lanes(q, k, v, layout.mask, scale)
    else:
        output = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=layout.mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )  # [L, H, W, D]
    heads, dim = output.shape[1], output.shape[3]
    tokens = output.transpose(1, 2).reshape(lanes * width, heads, dim).index_select(0, layout.places)  # [N, H, D]
    return tokens[None]  # [1, N, H, D]


lane_attention_forward = packed_only("lanes", "lane_layout", _attend_in_lanes)


def _eager_lanes(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(q kᵀ · scale, masked) v over lanes: queries [L, H, W, D], keys and values [L, Hkv, W, D] (the
    queries of each key-value head's G = H / Hkv heads read as one [G·W] block: no repeated keys), mask
    [L, 1, W, W] bool; [L, H, W, D].  The softmax's probabilities in the queries' dtype, its sums in fp32 (torch's
    kernel accumulates a bf16 softmax in fp32): the forward equals transformers' eager attention (an fp32 softmax
    rounded to bf16; bit for bit on the CPU), and the backward pass keeps one bf16 [W, W] matrix per head instead
    of an fp32 and a bf16 one (6.5 against 15.8 MB a layer for 3 lanes of 300 tokens)."""
    lanes, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scores = torch.matmul(query.view(lanes, kv_heads, groups * width, dim), key.transpose(-1, -2)) * scale
    scores = scores.view(lanes, kv_heads, groups, width, width)  # [L, Hkv, G, W, W]
    scores = scores.masked_fill(~mask[:, :, None], torch.finfo(scores.dtype).min)
    probabilities = torch.softmax(scores, dim=-1)  # bf16 in and out, accumulated in fp32 inside torch's kernel
    output = torch.matmul(probabilities.view(lanes, kv_heads, groups * width, width), value)  # [L, Hkv, G·W, D]
    return output.view(lanes, heads, width, dim)
