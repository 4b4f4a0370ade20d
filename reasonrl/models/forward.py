"""Forward helpers shared by the policy, the critic and the reward models: bf16 autocast, and the
backbone's hidden states at the positions that predict the response tokens."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from reasonrl.batch import pack_lanes


def autocast_context(compute_dtype: torch.dtype, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast over fp32 master weights when compute_dtype is bf16; a no-op otherwise."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)


# Architectures whose packed forward equals the padded one (tests/models/test_packing.py: log-probs,
# entropy and gradients to 1e-5, a tiny random config each).  Packing needs a model that reads each row's
# positions from ``position_ids`` and whose only mixing of tokens is attention: recurrent or convolutional
# state (Mamba, hybrid, RWKV, RecurrentGemma, LFM2 and Qwen3-Next layers) and positions computed from the
# attention mask (OPT) carry one row into the next, so those run padded.
PACKING_VERIFIED = frozenset({
    "apertus", "arcee", "bitnet", "cohere", "cohere2", "ernie4_5", "exaone4", "falcon", "gemma", "gemma2",
    "gemma3_text", "glm", "glm4", "gpt2", "gpt_neox", "granite", "granitemoe", "helium", "hunyuan_v1_dense",
    "idefics3", "llama", "ministral", "mistral", "mixtral", "nemotron", "olmo", "olmo2", "olmo3", "phi", "phi3",
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "stablelm", "starcoder2",
})  # fmt: skip


def packing_refusal(config) -> str | None:
    """Why rows of a model with this transformers ``config`` cannot run packed (None: they can)."""
    model_type = getattr(config, "model_type", None)
    if model_type in PACKING_VERIFIED:
        return None
    return (
        f"packed sequences are not verified for the '{model_type}' architecture (a recurrent or convolutional "
        "state, or positions it computes itself, would carry one row into the next); its micro-batches run padded"
    )


def read_tokens(prompt_mask: Tensor, response_mask: Tensor) -> Tensor:
    """[B, P+T] bool: the tokens a forward reads: the prompt's and every response token up to the last
    generated one, so the tokens injected between a conversation's turns (tool output, the verifier's
    prompt: in no loss, outside ``response_mask``) are read as the engine read them."""
    last_generated = response_mask.bool().flip(1).cummax(1).values.flip(1)  # [B, T]: at or before one
    return torch.cat([prompt_mask.bool(), last_generated], dim=1)


def response_hidden_states(
    backbone: torch.nn.Module,
    prompt_ids: Tensor,  # [B, P] left-padded
    prompt_mask: Tensor,  # [B, P]
    response_ids: Tensor,  # [B, T] right-padded
    response_mask: Tensor,  # [B, T]
    compute_dtype: torch.dtype,
    vision: dict[str, Tensor] | None = None,  # a VLM's pixel inputs, one entry per row (RolloutBatch.vision_inputs)
    packed: bool = True,
) -> Tensor:
    """The backbone's last hidden state at the position *before* each response token: [B, T, d].

    Row t is the state s_t that predicts response token t (position P + t − 1 of prompt + response),
    which is where log π(a_t | s_t) and V(s_t) are read (as verl does).  A vision-language backbone
    also reads ``vision``: the image tokens of the prompt become its images' features.

    ``packed`` (the default) runs the rows' read tokens packed, each row with its own position ids and no
    attention mask, which transformers reads as packed sequences (attention never crosses rows): with
    flash-attn one sequence [1, N] (its variable-length kernels skip what rows do not share); with sdpa
    or eager, which compute every pair of a sequence, lanes as long as the longest row, rows packed
    into them first-fit [L, W] (``pack_lanes``), so the attention stays that of rows of that length and
    only the lanes' tails are padding.  ``packed=False`` runs the padded [B, P+T] batch with an attention
    mask; both give the same states (tests/models/test_packing.py).  Positions after the last read
    token hold 0 (packed) or the padded forward's values; callers mask them.  An architecture outside
    ``PACKING_VERIFIED`` runs padded whatever ``packed`` says (its callers batch it padded too).
    """
    device = next(backbone.parameters()).device
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # [B, P+T]
    reads = read_tokens(prompt_mask, response_mask).to(device)  # [B, P+T]
    positions = reads.long().cumsum(-1) - 1  # [B, P+T]: each row's own, from 0
    images = {k: v.to(device) for k, v in (vision or {}).items()}
    states = slice(prompt_ids.shape[1] - 1, prompt_ids.shape[1] - 1 + response_ids.shape[1])  # s_t columns
    if not packed or packing_refusal(backbone.config):  # an unverified architecture: padded, always
        with autocast_context(compute_dtype, device):  # no KV cache: it would keep every layer's keys and values
            return backbone(
                input_ids=input_ids,
                attention_mask=reads.long(),
                position_ids=positions.clamp(min=0),
                use_cache=False,
                **images,
            ).last_hidden_state[:, states]  # [B, T, d]
    # 1. each row's lane and offset, and each read token's place [lane, column]
    lengths = reads.sum(1).tolist()  # [B]
    varlen = "flash" in str(getattr(backbone.config, "_attn_implementation", ""))
    lane, offset = pack_lanes(lengths, sum(lengths) if varlen else max(lengths))
    lane_of = torch.tensor(lane, device=device)[:, None].expand_as(reads)  # [B, P+T]
    column = torch.tensor(offset, device=device)[:, None] + positions  # [B, P+T]
    width = max(o + n for o, n in zip(offset, lengths, strict=True))
    # 2. the lanes: read tokens at their places, each row's positions from 0; a lane's tail continues its
    # last row's positions (it is read by nothing: attention is causal, and no state is taken there)
    lane_ids = torch.zeros(max(lane) + 1, width, dtype=input_ids.dtype, device=device)
    lane_positions = torch.arange(width, device=device).repeat(len(lane_ids), 1)
    lane_ids[lane_of[reads], column[reads]] = input_ids[reads]
    lane_positions[lane_of[reads], column[reads]] = positions[reads]
    # a VLM matches images to image tokens in reading order: the rows' order in the lanes
    in_lanes = sorted(range(len(lengths)), key=lambda r: (lane[r], offset[r]))
    images = {k: v[in_lanes] for k, v in images.items()}
    with autocast_context(compute_dtype, device):  # packed rows are read from the position ids: no mask, no cache
        hidden = backbone(
            input_ids=lane_ids, attention_mask=None, position_ids=lane_positions, use_cache=False, **images
        ).last_hidden_state  # [L, W, d]
    # 3. back to rows: the state before each response token
    wanted = reads[:, states]  # [B, T]
    picked = hidden[lane_of[:, states], column[:, states].clamp(0, width - 1)]  # [B, T, d]
    return picked * wanted[..., None].to(picked.dtype)
