"""Per-token log-probs and entropy of responses, without materialising the full-vocabulary logits.

The backbone runs once over prompt + response; the LM head, the log-softmax and the entropy run on
the response positions only, ``chunk_tokens`` rows at a time (``models.logprob_head.token_logprobs``: the head's
GEMM in the compute dtype, the log-sum-exp in fp32, each chunk recomputed in the backward pass), so at most one
chunk of [chunk, V] fp32 logits is alive.  A plain HF forward+backward on 32 × 200 tokens holds several 1.26 GB
copies of the logits.

A ``head_mask`` narrows the head further, to the positions a loss or a metric reads: T-PPO's token
filtering (arXiv 2506.15050), where the policy loss sees only the latest window's tokens of a
response whose earlier windows the backbone must still read.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from reasonrl.models.forward import response_hidden_states, runs_in_lanes
from reasonrl.models.liger_kernels import fused_linear_logprobs
from reasonrl.models.logprob_head import DEFAULT_CHUNK_TOKENS, token_logprobs
from reasonrl.models.model_error import ModelError


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: Tensor,  # [B, P] left-padded
    prompt_mask: Tensor,  # [B, P]
    response_ids: Tensor,  # [B, T] right-padded
    response_mask: Tensor,  # [B, T]
    *,
    head_mask: Tensor | None = None,  # [B, T] bool
    vision: dict[str, Tensor] | None = None,  # a VLM's pixel inputs per row
    temperature: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    suppressed: tuple[int, ...] = (),
    packed: bool = True,
    share_prompts: bool = False,
    logprob_head: str = "chunked",
) -> tuple[Tensor, Tensor | None]:
    """log π(a_t | s_t) and the policy entropy H(π(·|s_t)) at every response token; both [B, T].

    Log-probs are of softmax(logits / temperature), as the rollout sampled them.  Masked positions
    hold 0.  Gradients flow into the log-probs (and the entropy) when grad mode is on.
    ``head_mask`` (default: every response token) limits the LM head, the log-softmax and the entropy
    to those response tokens; the others hold 0 too.  The backbone still runs over the whole sequence.
    Without a head token the output stays connected to the model, so a backward still runs.
    ``packed`` runs the rows as one sequence without padding, ``share_prompts`` reads a prompt that several rows
    share once (``models.forward.response_hidden_states``).  ``logprob_head``: chunked (``token_logprobs``) or liger
    (Liger's fused linear cross-entropy, ``models.liger_kernels.fused_linear_logprobs``), which gives no entropy:
    None in its place.
    """
    device = next(model.parameters()).device
    response_hidden = response_hidden_states(
        model.base_model,
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        compute_dtype,
        vision,
        packed,
        share_prompts,
    )  # [B, T, d]
    mask = response_mask.to(device).bool()
    if head_mask is not None:
        mask = mask & head_mask.to(device).bool()
    flat_hidden = response_hidden[mask]  # [N, d]
    flat_targets = response_ids.to(device)[mask]  # [N]
    head = model.get_output_embeddings()
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=device)  # [B, T]
    if logprob_head == "liger":  # a VLM (a suppressed image token) is refused at setup: Liger's head cannot mask it
        flat_logprobs = fused_linear_logprobs(flat_hidden, head, flat_targets, temperature, compute_dtype)  # [N]
        return zeros.masked_scatter(mask, flat_logprobs), None
    flat_logprobs, flat_entropy = token_logprobs(
        flat_hidden, head, flat_targets, temperature, suppressed, compute_dtype, chunk_tokens
    )  # [N], [N]
    return zeros.masked_scatter(mask, flat_logprobs), zeros.masked_scatter(mask, flat_entropy)


def suppressed_tokens(model: PreTrainedModel) -> tuple[int, ...]:
    """Tokens a policy never generates: a vision-language model's image placeholder, which in a response
    would claim image features no image supplies.  The engines mask them out of sampling and the trainer
    out of its log-probs, so both read the same distribution."""
    image_token = getattr(model.config, "image_token_id", None)
    return () if image_token is None else (image_token,)


class TokenLogprobs(torch.nn.Module):
    """``response_logprobs`` of a policy as one module call.

    Data-parallel training shards this module with FSDP2 as the root unit: the policy's embeddings,
    final norm and LM head (tied in SmolLM2) are gathered for the whole call, the chunked LM head
    included, which calling the backbone and the head separately would bypass.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        temperature: float,
        compute_dtype: torch.dtype,
        packed: bool = True,
        share_prompts: bool = False,
        logprob_head: str = "chunked",
    ) -> None:
        super().__init__()
        self.model, self.temperature, self.compute_dtype, self.packed = model, temperature, compute_dtype, packed
        self.share_prompts = packed and share_prompts
        self.suppressed = suppressed_tokens(model)
        if logprob_head == "liger" and self.suppressed:
            raise ModelError(
                "model.logprob_head=liger cannot take a vision-language model's image token out of the distribution "
                "(Liger's fused cross-entropy has no token mask); use auto or chunked"
            )
        self.logprob_head = logprob_head

    @property
    def lanes(self) -> bool:
        """Whether its packed forwards run in lanes (``models.forward.runs_in_lanes``): how its micro-batches are
        cut to the token budget."""
        return runs_in_lanes(self.model.config)

    def forward(self, batch, head_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """A RolloutBatch -> (log-probs [B, T], entropy [B, T] or None with Liger's head), computed at ``head_mask``
        [B, T] only (default: every response token) as ``response_logprobs`` does."""
        return response_logprobs(
            self.model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.response_ids,
            batch.response_mask,
            head_mask=head_mask,
            vision=batch.vision_inputs(),
            temperature=self.temperature,
            compute_dtype=self.compute_dtype,
            suppressed=self.suppressed,
            packed=self.packed,
            share_prompts=self.share_prompts,
            logprob_head=self.logprob_head,
        )


def head_tokens(batch, head_mask: Tensor | None = None) -> int:
    """Response tokens of a RolloutBatch that a ``TokenLogprobs`` call with ``head_mask`` runs the LM head on."""
    mask = batch.response_mask.bool()
    return int((mask if head_mask is None else mask & head_mask.bool()).sum())
