"""Forward helpers shared by the policy, the critic and the reward models: bf16 autocast, and the
backbone's hidden states at the positions that predict the response tokens."""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch import Tensor

from reasonrl.models.varlen_attention import (
    LANE_ATTENTION,
    VARLEN_ATTENTION,
    LaneLayout,
    packed_varlen_forward,
    segment_boundaries,
)
from reasonrl.packing import pack_lanes, prompt_segments


def autocast_context(compute_dtype: torch.dtype, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast over fp32 master weights when compute_dtype is bf16; a no-op otherwise."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)


def weight_casts_kept(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """A block (a mini-batch's micro-batches) whose forwards under ``autocast_context`` cast each fp32 weight to bf16
    once, not once per micro-batch (0.09 s per forward for the 135M model on 2 CPU cores): autocast keeps its casts
    until its outermost context exits, and this is one, entered with autocast off, so nothing between the forwards
    runs under it.  The weights must not change inside the block.  With gradient checkpointing a no-op: the casts
    would then outlive each micro-batch (those of a forward without it are saved for its backward anyway)."""
    checkpointed = any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())
    if checkpointed:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, enabled=False)


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


# Architectures whose shared-prompt forward equals the padded one (tests/models/test_packing.py, as above):
# the prompt read once with a custom [L, 1, W, W] attention mask, which a model must apply as given in every
# layer (a sliding-window layer builds its own window, so configs with one are refused below).
PROMPT_SHARING_VERIFIED = PACKING_VERIFIED - {"idefics3"}  # a VLM's images are read per row


def prompt_sharing_refusal(config, device_type: str) -> str | None:
    """Why rows that share a prompt cannot read it once, in a model with this transformers ``config`` on
    ``device_type`` (None: they can).  Sharing needs an attention that takes a custom mask (sdpa, eager) and
    layers that use it as given; it runs on the CPU, where lanes are the packed layout (a GPU's long answers
    share a smaller fraction of their tokens, and flash-attn's variable-length kernels take no mask)."""
    model_type = getattr(config, "model_type", None)
    attention = str(getattr(config, "_attn_implementation", None))
    kinds = getattr(config, "layer_types", None)  # each layer's attention, where the config names them
    sliding = (
        any("sliding" in str(kind) or "chunked" in str(kind) for kind in kinds)
        if kinds
        else bool(getattr(config, "sliding_window", None))
    )
    if device_type != "cpu":
        return f"prompts are shared on the CPU only (this run's device: {device_type})"
    if model_type not in PROMPT_SHARING_VERIFIED:
        return f"a shared prompt is not verified for the '{model_type}' architecture"
    if attention not in ("sdpa", "eager", LANE_ATTENTION):
        return f"the {attention} attention takes no custom mask"
    if sliding:
        return "a sliding-window layer would ignore the shared prompt's mask"
    return None


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
    share_prompts: bool = False,
) -> Tensor:
    """The backbone's last hidden state at the position *before* each response token: [B, T, d].

    Row t is the state s_t that predicts response token t (position P + t − 1 of prompt + response),
    which is where log π(a_t | s_t) and V(s_t) are read (as verl does).  A vision-language backbone
    also reads ``vision``: the image tokens of the prompt become its images' features.

    ``packed`` (the default) runs the rows' read tokens packed, each row with its own position ids and no
    attention mask (transformers' packed sequences): one sequence [1, N] for flash-attn and for torch's varlen
    (``models.varlen_attention``), or for sdpa and eager lanes [L, W] as long as the longest row, rows packed
    into them first-fit (``pack_lanes``); the ``lanes`` attention runs the one sequence through every op but
    attention, which reads it in those lanes (``lane_tokens_forward``).
    ``share_prompts`` (``prompt_sharing_refusal``) reads a prompt several rows share once: one segment
    [prompt, response 1, response 2, ...] under a mask that lets each response see the prompt and itself.
    ``packed=False`` runs the padded [B, P+T] batch with an attention mask; all give the same states
    (docs/packing.md).  Positions after the last read token hold 0 (packed) or the padded forward's values;
    callers mask them.  An architecture outside ``PACKING_VERIFIED`` runs padded whatever ``packed`` says.
    """
    device = next(backbone.parameters()).device
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # [B, P+T]
    reads = read_tokens(prompt_mask, response_mask).to(device)  # [B, P+T]
    positions = reads.long().cumsum(-1) - 1  # [B, P+T]: each row's own, from 0
    images = {k: v.to(device) for k, v in (vision or {}).items()}
    states = slice(prompt_ids.shape[1] - 1, prompt_ids.shape[1] - 1 + response_ids.shape[1])  # s_t columns
    if not packed or packing_refusal(backbone.config):  # an unverified architecture: padded, always
        inputs = dict(input_ids=input_ids, attention_mask=reads.long(), position_ids=positions.clamp(min=0), **images)
        return lanes_forward(backbone, compute_dtype, inputs)[:, states]  # [B, T, d]
    share_prompts = share_prompts and not images and prompt_sharing_refusal(backbone.config, device.type) is None
    # 1. each segment's lane and offset (a row, or the rows sharing a prompt), and each read token's place
    # [lane, column]: a shared prompt's tokens at the same place for each of its rows, each response after the
    # responses of the rows before it in the segment
    segments = prompt_segments(prompt_ids, prompt_mask) if share_prompts else [[r] for r in range(len(reads))]
    lengths = reads.sum(1).tolist()  # [B]
    segment_of, responses_before, segment_lengths = segment_places(segments, lengths, prompt_mask.sum(1).tolist())
    attention = str(getattr(backbone.config, "_attn_implementation", ""))
    one_lane = "flash" in attention or attention == VARLEN_ATTENTION  # one sequence [1, N]
    lane, offset = pack_lanes(segment_lengths, sum(segment_lengths) if one_lane else max(segment_lengths))
    lane_of = torch.tensor([lane[s] for s in segment_of], device=device)[:, None].expand_as(reads)  # [B, P+T]
    in_response = torch.arange(reads.shape[1], device=device) >= prompt_ids.shape[1]  # [P+T]
    column = (  # [B, P+T]
        torch.tensor([offset[s] for s in segment_of], device=device)[:, None]
        + positions
        + torch.tensor(responses_before, device=device)[:, None] * in_response
    )
    width = max(o + n for o, n in zip(offset, segment_lengths, strict=True))
    # 2. the lanes: read tokens at their places, each row's positions from 0; a lane's tail continues its
    # last row's positions (it is read by nothing: attention is causal, and no state is taken there)
    lane_ids = torch.zeros(max(lane) + 1, width, dtype=input_ids.dtype, device=device)
    lane_positions = torch.arange(width, device=device).repeat(len(lane_ids), 1)
    lane_ids[lane_of[reads], column[reads]] = input_ids[reads]
    lane_positions[lane_of[reads], column[reads]] = positions[reads]
    mask = None  # packed rows are read from the position ids; segments, and the lanes attention, need a mask
    if share_prompts or attention == LANE_ATTENTION:
        eager = attention == "eager"
        mask = shared_prompt_mask(lane_of[reads], column[reads], segment_of, reads, in_response, lane_ids.shape, eager)
    if attention == LANE_ATTENTION:  # the read places alone, in lane order, through every op but attention
        places = torch.unique(lane_of[reads] * width + column[reads])  # [N] ascending
        hidden = lane_tokens_forward(backbone, compute_dtype, lane_ids, lane_positions, LaneLayout(places, mask))
    else:
        # a VLM matches images to image tokens in reading order: the rows' order in the lanes
        in_lanes = sorted(range(len(lengths)), key=lambda r: (lane[segment_of[r]], offset[segment_of[r]]))
        images = {k: v[in_lanes] for k, v in images.items()}
        inputs = dict(input_ids=lane_ids, attention_mask=mask, position_ids=lane_positions, **images)
        varlen_order = sorted(zip(offset, segment_lengths, strict=True)) if attention == VARLEN_ATTENTION else None
        hidden = lanes_forward(backbone, compute_dtype, inputs, varlen_order and [n for _, n in varlen_order])
    # 3. back to rows: the state before each response token
    wanted = reads[:, states]  # [B, T]
    picked = hidden[lane_of[:, states], column[:, states].clamp(0, width - 1)]  # [B, T, d]
    return picked * wanted[..., None].to(picked.dtype)


def runs_in_lanes(config) -> bool:
    """Whether a packed forward of a model with ``config`` runs lanes [L, W] as wide as its longest row (sdpa and
    eager attention) rather than one sequence [1, N] (flash-attn, ``model.attention=varlen``, and ``lanes``, whose
    lanes are attention's alone): what a micro-batch of packed rows costs (``RolloutBatch.micro_batch_rows``)."""
    attention = str(getattr(config, "_attn_implementation", ""))
    return not ("flash" in attention or attention in (VARLEN_ATTENTION, LANE_ATTENTION))


def lanes_forward(backbone: torch.nn.Module, compute_dtype: torch.dtype, inputs: dict,
                  varlen_segments: list[int] | None = None) -> Tensor:  # fmt: skip
    """The backbone's last hidden states [L, W, d] of the lanes ``inputs`` (input_ids, position_ids, attention_mask,
    a VLM's images; or of a padded batch), without a KV cache (it would keep every layer's keys and values).
    ``varlen_segments``: the lengths of the one lane's segments in order, for model.attention=varlen
    (``models.varlen_attention``: their bounds computed once for every layer, and no mask built)."""
    device = inputs["input_ids"].device
    boundaries = segment_boundaries(varlen_segments, device) if varlen_segments else {}
    no_mask = packed_varlen_forward() if varlen_segments else contextlib.nullcontext()
    with autocast_context(compute_dtype, device), no_mask:
        return backbone(**inputs, **boundaries, use_cache=False).last_hidden_state


def lane_tokens_forward(backbone: torch.nn.Module, compute_dtype: torch.dtype, lane_ids: Tensor,
                        lane_positions: Tensor, layout: LaneLayout) -> Tensor:  # fmt: skip
    """The backbone's last hidden states [L, W, d] of the lanes ``lane_ids`` and ``lane_positions`` [L, W] with
    ``model.attention=lanes``: their ``layout.places`` alone run, as one sequence [1, N], every other place holds 0."""
    lanes, width = lane_ids.shape
    places = layout.places
    inputs = dict(input_ids=lane_ids.view(1, -1)[:, places], position_ids=lane_positions.view(1, -1)[:, places])
    with autocast_context(compute_dtype, lane_ids.device), packed_varlen_forward():
        hidden = backbone(**inputs, lane_layout=layout, use_cache=False).last_hidden_state[0]  # [N, d]
    placed = hidden.new_zeros(lanes * width, hidden.shape[-1]).index_copy(0, places, hidden)
    return placed.view(lanes, width, -1)


def segment_places(
    segments: list[list[int]], lengths: list[int], prompt_lengths: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Where each row of ``segments`` (rows reading one sequence: a row alone, or the rows sharing a prompt) is:
    its segment [B], the response tokens of its segment's earlier rows, after which its own response starts [B],
    and each segment's tokens (its prompt once, then every row's response).  ``lengths`` [B] are the rows' read
    tokens, ``prompt_lengths`` [B] their prompts'."""
    segment_of, responses_before = [0] * len(lengths), [0] * len(lengths)
    for index, rows in enumerate(segments):
        for row, following in itertools.pairwise(rows):
            responses_before[following] = responses_before[row] + lengths[row] - prompt_lengths[row]
        for row in rows:
            segment_of[row] = index
    return segment_of, responses_before, [lengths[rows[-1]] + responses_before[rows[-1]] for rows in segments]


def shared_prompt_mask(
    lanes: Tensor,  # [N] the lane of each read token (row by row)
    columns: Tensor,  # [N] its column
    segment_of: list[int],  # [B] each row's segment
    reads: Tensor,  # [B, P+T] bool
    in_response: Tensor,  # [P+T] bool: the response's columns
    shape: torch.Size,  # [L, W]
    additive: bool = False,  # eager attention adds the mask to its scores
) -> Tensor:
    """[L, 1, W, W] bool, True where a query token (row 2) attends to a key token (row 3): earlier or the
    same token of its own segment that is the shared prompt or of its own row's response.  A lane's unread
    tail attends to itself only (no row reads it).  ``additive``: float32, 0 where it attends and the
    lowest float elsewhere."""
    device = reads.device
    rows = torch.arange(len(reads), device=device)[:, None].expand_as(reads)[reads]  # [N]
    segment = torch.full(shape, -1, device=device)  # [L, W]
    owner = torch.full(shape, -1, device=device)  # [L, W]: the row a response token is of, −1 on a prompt
    segment[lanes, columns] = torch.tensor(segment_of, device=device)[rows]
    owner[lanes, columns] = torch.where(in_response.expand_as(reads)[reads], rows, -1)
    order = torch.arange(shape[1], device=device)
    causal = order[:, None] >= order[None, :]  # [W, W]
    same_segment = (segment[:, :, None] == segment[:, None, :]) & (segment[:, None, :] >= 0)  # [L, W, W]
    visible = (owner[:, None, :] < 0) | (owner[:, :, None] == owner[:, None, :])  # [L, W, W]
    attends = (same_segment & visible & causal | torch.eye(shape[1], dtype=torch.bool, device=device))[:, None]
    if not additive:
        return attends
    return torch.zeros(attends.shape, device=device).masked_fill(~attends, torch.finfo(torch.float32).min)
