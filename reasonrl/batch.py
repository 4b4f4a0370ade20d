"""``RolloutBatch``: everything a training step needs, as one typed object.

Prompts are left-padded and responses right-padded; every mask is explicit (never derived from
``ids != pad``: SmolLM2's pad token is also its end-of-turn token).  Shape letters: B sequences,
P prompt tokens, T response tokens.

A vision-language batch also carries its prompts' images, once per distinct prompt (not once per sample):
``vision`` holds the model's pixel inputs [I, N, ...] (I image prompts, N images each, zero-padded) and
``image_index`` [B] the row of them each sequence's prompt shows (−1: a text prompt).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """A batch of prompts, sampled responses, and the per-token quantities derived from them."""

    prompt_ids: Tensor  # [B, P] long, left-padded
    prompt_mask: Tensor  # [B, P] bool
    response_ids: Tensor  # [B, T] long, right-padded
    response_mask: Tensor  # [B, T] bool: generated tokens, EOS included
    policy_loss_mask: Tensor  # [B, T] bool: tokens the policy loss sees
    value_loss_mask: Tensor  # [B, T] bool: tokens the value loss sees
    rollout_logprobs: Tensor  # [B, T] float: as the engine reported
    rewards: Tensor  # [B] float: final (shaped) sequence reward
    correct: Tensor  # [B] bool: verifier verdict
    truncated: Tensor  # [B] bool: hit the length cap without a stop token
    group_ids: Tensor  # [B] long: same id = same prompt
    old_logprobs: Tensor | None = None  # [B, T] behaviour log-probs recomputed by the trainer
    ref_logprobs: Tensor | None = None  # [B, T] reference-policy log-probs (KL only)
    values: Tensor | None = None  # [B, T] V(s_t) (critic only)
    token_rewards: Tensor | None = None  # [B, T]
    advantages: Tensor | None = None  # [B, T]
    returns: Tensor | None = None  # [B, T]
    running: Tensor | None = None  # [B] bool: T-PPO, still generating (no stop token, under the cap)
    stale_mask: Tensor | None = None  # [B, T] bool: T-PPO, tokens generated in earlier windows by older policies
    turn_rewards: Tensor | None = None  # [B, T] float: multi-turn, each generated turn's reward on its last token
    role_ids: Tensor | None = None  # [B, T] long: multi-turn, the role of each generated token (rollout.multiturn)
    turn_ids: Tensor | None = None  # [B, T] long: multi-turn, the generated turn of each token, -1 elsewhere
    dense_rewards: Tensor | None = None  # [B, T] float: process rewards on line-end tokens, added to the outcome's
    vision: dict[str, Tensor] | None = None  # each [I, N, ...]: the pixel inputs of the I image prompts (VLM)
    image_index: Tensor | None = None  # [B] long: each sequence's row of ``vision``; -1 = a text prompt

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def _tensors(self) -> dict[str, Tensor | None]:
        """The per-sequence tensors (row i = sequence i): every field but the images."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in IMAGE_FIELDS}

    def select(self, index: Tensor | Sequence[int]) -> RolloutBatch:
        """The rows ``index`` (a view-free copy), padding columns trimmed to the rows kept (and images to
        the prompts kept)."""
        index = torch.as_tensor(index, dtype=torch.long)
        rows = {k: (v[index] if v is not None else None) for k, v in self._tensors().items()}
        if self.vision is None or self.image_index is None:
            return RolloutBatch(**rows).trimmed()
        shown = self.image_index[index]  # [b]
        kept = torch.unique(shown[shown >= 0])  # [i] the image prompts the rows show, in order
        remap = torch.full((len(next(iter(self.vision.values()))),), -1, dtype=torch.long, device=shown.device)
        remap[kept] = torch.arange(len(kept), device=shown.device)
        vision = {k: v[kept] for k, v in self.vision.items()}
        image_index = torch.where(shown >= 0, remap[shown.clamp(min=0)], shown)
        return RolloutBatch(**rows, vision=vision, image_index=image_index).trimmed()

    def vision_inputs(self) -> dict[str, Tensor]:
        """The model's image inputs for these rows, one entry per sequence (a text prompt's all zero: a
        padding image); empty when no row shows an image."""
        if self.vision is None or self.image_index is None or not bool((self.image_index >= 0).any()):
            return {}
        rows, shows = self.image_index.clamp(min=0), self.image_index >= 0  # [B], [B]
        return {k: v[rows] * shows.view(-1, *[1] * (v.dim() - 1)).to(v.dtype) for k, v in self.vision.items()}

    def without_loss(self) -> RolloutBatch:
        """This batch with no token in any loss (its forward and backward add nothing to a gradient):
        the filler a data-parallel rank runs to keep in step with the others."""
        none = torch.zeros_like(self.response_mask)
        return dataclasses.replace(
            self, policy_loss_mask=none, value_loss_mask=none, correct=torch.zeros_like(self.correct)
        )

    def trimmed(self) -> RolloutBatch:
        """Drop prompt columns that are padding in every row (left) and response columns likewise (right)."""
        prompt_keep = int(self.prompt_mask.any(dim=0).nonzero().min()) if self.prompt_mask.any() else 0
        response_len = int(self.response_mask.any(dim=0).nonzero().max()) + 1 if self.response_mask.any() else 0
        out = {}
        for key, value in self._tensors().items():
            if value is None or value.dim() < 2:
                out[key] = value
            elif key.startswith("prompt_"):
                out[key] = value[:, prompt_keep:]
            else:
                out[key] = value[:, :response_len]
        return RolloutBatch(**out, vision=self.vision, image_index=self.image_index)

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """Stack batches, re-padding prompts on the left and responses on the right."""
        fields = batches[0]._tensors()
        out: dict[str, Tensor | None] = {}
        for key, first in fields.items():
            values = [getattr(b, key) for b in batches]
            if first is None:
                out[key] = None
            elif first.dim() == 1:
                out[key] = torch.cat(values)
            else:
                width = max(v.shape[1] for v in values)
                left = key.startswith("prompt_")
                padded = [_pad(v, width, left) for v in values]
                out[key] = torch.cat(padded)
        return RolloutBatch(**out, **_concat_images(batches))

    def micro_batch_rows(self, token_budget: int) -> list[list[int]]:
        """Row indices of micro-batches whose padded size (rows × (prompt + response width)) fits the budget.

        Rows are grouped by length so that little padding is computed; every row is in exactly one
        group (sorted).  A single row larger than the budget still forms its own group.
        """
        prompt_lens = self.prompt_mask.sum(1).tolist()  # [B]
        response_lens = self.response_mask.sum(1).tolist()  # [B]
        order = sorted(range(len(self)), key=lambda r: (prompt_lens[r] + response_lens[r], r), reverse=True)
        groups: list[list[int]] = []
        current: list[int] = []
        widest_prompt = widest_response = 0
        for row in order:
            prompt_w = max(widest_prompt, prompt_lens[row])
            response_w = max(widest_response, response_lens[row])
            if current and (prompt_w + response_w) * (len(current) + 1) > token_budget:
                groups.append(sorted(current))
                current, prompt_w, response_w = [], prompt_lens[row], response_lens[row]
            current.append(row)
            widest_prompt, widest_response = prompt_w, response_w
        if current:
            groups.append(sorted(current))
        return groups

    def micro_batches(self, token_budget: int, device: torch.device | str = "cpu") -> list[RolloutBatch]:
        """The micro-batches of ``micro_batch_rows`` as batches, each moved to ``device`` (the batch
        itself stays where it is: one copy per micro-batch)."""
        return [self.select(rows).to(device) for rows in self.micro_batch_rows(token_budget)]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """This batch with every tensor on ``device`` (itself when they are there already)."""
        if torch.device(device) == self.prompt_ids.device:
            return self
        moved = {k: (v.to(device) if v is not None else None) for k, v in self._tensors().items()}
        vision = None if self.vision is None else {k: v.to(device) for k, v in self.vision.items()}
        image_index = None if self.image_index is None else self.image_index.to(device)
        return RolloutBatch(**moved, vision=vision, image_index=image_index)


IMAGE_FIELDS = ("vision", "image_index")


def prompt_images(prompts: Sequence[Sequence[int]]) -> dict:
    """The ``vision`` and ``image_index`` of a batch whose row i has prompt ``prompts[i]``: each distinct
    image prompt's pixel inputs once (a group's samples share their prompt object), text prompts -1."""
    distinct: dict[int, ImagePrompt] = {}
    for prompt in prompts:
        if isinstance(prompt, ImagePrompt):
            distinct.setdefault(id(prompt), prompt)
    if not distinct:
        return {"vision": None, "image_index": None}
    row = {key: i for i, key in enumerate(distinct)}
    keys = next(iter(distinct.values())).vision.keys()
    vision = {k: pad_images([p.vision[k][None] for p in distinct.values()]) for k in keys}
    return {"vision": vision, "image_index": torch.tensor([row.get(id(p), -1) for p in prompts], dtype=torch.long)}


def _concat_images(batches: Sequence[RolloutBatch]) -> dict:
    """The ``vision`` and ``image_index`` of concatenated batches: image rows stacked (the images per
    prompt zero-padded to the most), each batch's indices shifted past the rows before it."""
    if all(b.vision is None for b in batches):
        return {"vision": None, "image_index": None}
    keys = next(b.vision for b in batches if b.vision is not None).keys()
    parts: dict[str, list[Tensor]] = {k: [] for k in keys}
    indices, offset = [], 0
    for b in batches:
        if b.vision is None or b.image_index is None:
            indices.append(torch.full((len(b),), -1, dtype=torch.long))
            continue
        indices.append(torch.where(b.image_index >= 0, b.image_index + offset, b.image_index))
        offset += next(iter(b.vision.values())).shape[0]
        for k in keys:
            parts[k].append(b.vision[k])
    return {"vision": {k: pad_images(v) for k, v in parts.items()}, "image_index": torch.cat(indices)}


def pad_images(values: Sequence[Tensor]) -> Tensor:
    """[I_j, N_j, ...] tensors as one [ΣI_j, max N_j, ...], missing images all zero (a padding image)."""
    most = max(v.shape[1] for v in values)
    padded = [torch.cat([v, v.new_zeros(v.shape[0], most - v.shape[1], *v.shape[2:])], 1) for v in values]
    return torch.cat(padded)


class ImagePrompt(list):
    """A prompt's token ids (its images' tokens in place, as the processor expands them) that also carries
    the pixel inputs of its images: ``vision`` maps each model input (``pixel_values`` [N, 3, H, W], and
    for Idefics3 ``pixel_attention_mask`` [N, H, W]) to its tensor, N the prompt's images; ``images`` the
    images themselves, for an engine that processes them its own way (vLLM); ``processed_length`` how
    many of the ids the processor made (the rest is a continuation).  A list, so it goes wherever
    prompt ids go; an engine that cannot see images refuses it."""

    def __init__(
        self,
        ids: Sequence[int],
        vision: dict[str, torch.Tensor],
        images: Sequence = (),
        processed_length: int | None = None,
    ) -> None:
        super().__init__(ids)
        self.vision = vision
        self.images = list(images)
        self.processed_length = len(self) if processed_length is None else processed_length

    def extended(self, tokens: Sequence[int]) -> ImagePrompt:
        """This prompt followed by ``tokens`` (a continuation), showing the same images."""
        return ImagePrompt([*self, *tokens], self.vision, self.images, self.processed_length)

    def __add__(self, tokens) -> ImagePrompt:  # ``prompt + continuation`` keeps the images too
        return self.extended(tokens)


def _pad(value: Tensor, width: int, left: bool) -> Tensor:
    missing = width - value.shape[1]
    if missing == 0:
        return value
    pad = torch.zeros(value.shape[0], missing, dtype=value.dtype)
    return torch.cat([pad, value] if left else [value, pad], dim=1)


def pad_rows(rows: Sequence[Sequence], width: int, left: bool, dtype: torch.dtype, fill=0) -> torch.Tensor:
    """Ragged rows as one [N, width] tensor, padded with ``fill`` on the left (prompts) or the right."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            values = torch.tensor(list(row), dtype=dtype)
            if left:
                out[i, width - len(row) :] = values
            else:
                out[i, : len(row)] = values
    return out
