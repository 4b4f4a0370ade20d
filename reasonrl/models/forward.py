"""Forward helpers shared by the policy, the critic and the reward models: bf16 autocast, and the
backbone's hidden states at the positions that predict the response tokens."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor


def autocast_context(compute_dtype: torch.dtype, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast over fp32 master weights when compute_dtype is bf16; a no-op otherwise."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)


def response_hidden_states(
    backbone: torch.nn.Module,
    prompt_ids: Tensor,  # [B, P] left-padded
    prompt_mask: Tensor,  # [B, P]
    response_ids: Tensor,  # [B, T] right-padded
    response_mask: Tensor,  # [B, T]
    compute_dtype: torch.dtype,
    vision: dict[str, Tensor] | None = None,  # a VLM's pixel inputs, one entry per row (RolloutBatch.vision_inputs)
) -> Tensor:
    """The backbone's last hidden state at the position *before* each response token: [B, T, d].

    Row t is the state s_t that predicts response token t (position P + t − 1 of prompt + response),
    which is where log π(a_t | s_t) and V(s_t) are read (as verl does).  A vision-language backbone
    also reads ``vision``: the image tokens of the prompt become its images' features.
    """
    device = next(backbone.parameters()).device
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # [B, P+T]
    attention = torch.cat([prompt_mask, response_mask], dim=1).to(device)  # [B, P+T]
    positions = (attention.long().cumsum(-1) - 1).clamp(min=0)  # [B, P+T]
    with autocast_context(compute_dtype, device):
        images = {k: v.to(device) for k, v in (vision or {}).items()}
        hidden = backbone(
            input_ids=input_ids, attention_mask=attention.long(), position_ids=positions, **images
        ).last_hidden_state  # [B, P+T, d]
    prompt_len = prompt_ids.shape[1]
    return hidden[:, prompt_len - 1 : prompt_len - 1 + response_ids.shape[1]]  # [B, T, d]
