"""``RolloutBatch``: everything a training step needs, as one typed object.

Prompts are left-padded and responses right-padded; every mask is explicit (never derived from
``ids != pad``: SmolLM2's pad token is also its end-of-turn token).  Shape letters: B sequences,
P prompt tokens, T response tokens.

Beside the quantities every algorithm's step fills (old and reference log-probs, values, token rewards,
advantages, returns), a feature that adds its own per-sequence state holds it in one optional record:
T-PPO's ``PoolWindow`` (running rows, stale tokens), multi-turn's ``TurnLabels`` (turn rewards, roles,
turn indices) and a vision-language batch's ``PromptImages`` (each distinct prompt's images once, not
once per sample); process rewards are one tensor, ``dense_rewards``.  A record selects, trims,
concatenates and moves with the batch's rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

import torch
from torch import Tensor

from reasonrl.packing import balanced_bins, lane_tokens, prompt_segments


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
    # each feature's own state (None where the run does not use the feature):
    pool_window: PoolWindow | None = None  # T-PPO: running rows [B] and earlier windows' tokens [B, T]
    turns: TurnLabels | None = None  # multi-turn: each token's turn reward, role and turn [B, T]
    dense_rewards: Tensor | None = None  # [B, T] float: process rewards on line-end tokens, added to the outcome's
    policy_versions: Tensor | None = None  # [B, T] long: the policy version that sampled each token (async), −1 off it
    images: PromptImages | None = None  # vision-language: pixel inputs [I, N, ...] once per prompt, row index [B]

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def _tensors(self) -> dict[str, Tensor | None]:
        """The loose per-sequence tensors (row i = sequence i): every field but the feature records."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in RECORD_FIELDS}

    def _records(self, change: Callable[[BatchRecord], BatchRecord]) -> dict[str, BatchRecord | None]:
        """Each feature record as ``change`` makes it (an absent one stays None)."""
        return {name: None if (r := getattr(self, name)) is None else change(r) for name in RECORD_FIELDS}

    def select(self, index: Tensor | Sequence[int]) -> RolloutBatch:
        """The rows ``index`` (a view-free copy), padding columns trimmed to the rows kept (and images to
        the prompts kept)."""
        index = torch.as_tensor(index, dtype=torch.long)
        rows = {k: (v[index] if v is not None else None) for k, v in self._tensors().items()}
        return RolloutBatch(**rows, **self._records(lambda record: record.select(index))).trimmed()

    def vision_inputs(self) -> dict[str, Tensor]:
        """The model's image inputs for these rows, one entry per sequence (a text prompt's all zero: a
        padding image); empty when no row shows an image."""
        return {} if self.images is None else self.images.per_row()

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
        return RolloutBatch(**out, **self._records(lambda record: record.trimmed(response_len)))

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
                out[key] = _cat_padded(values, left=key.startswith("prompt_"))
        lengths = [len(b) for b in batches]
        records = {name: _concat_records([getattr(b, name) for b in batches], lengths) for name in RECORD_FIELDS}
        return RolloutBatch(**out, **records)

    def read_lengths(self) -> list[int]:
        """Tokens a forward reads per row: its prompt and its response up to the last generated token
        (a conversation's injected tokens included; ``models.forward.read_tokens``)."""
        generated = self.response_mask.bool()
        last = torch.where(generated.any(1), generated.shape[1] - generated.flip(1).int().argmax(1), 0)  # [B]
        return (self.prompt_mask.sum(1) + last).tolist()

    def forward_tokens(self, packed: bool = True, share_prompts: bool = False, lanes: bool = True) -> int:
        """Tokens a forward over this batch computes: packed in ``lanes`` (sdpa and eager attention: ``pack_lanes``,
        lanes × the longest row, or with ``share_prompts`` lanes × the longest segment of rows sharing a prompt,
        ``lane_tokens``) or as one sequence (flash-attn, varlen: the read tokens alone); padded, rows × width."""
        if not packed:
            return len(self) * (self.prompt_ids.shape[1] + self.response_ids.shape[1])
        lengths = self.segment_lengths(share_prompts)
        return lane_tokens(lengths) if lanes else sum(lengths)

    def segment_lengths(self, share_prompts: bool) -> list[int]:
        """Tokens of each sequence a packed forward reads: each row's read tokens, or with ``share_prompts``
        each prompt's once, followed by the responses of the rows that share it (``prompt_segments``)."""
        if not share_prompts:
            return self.read_lengths()
        return [tokens for _, tokens in self.prompt_sharing_units(math.inf)]  # a whole group: no budget splits it

    def micro_batch_rows(
        self, token_budget: int, packed: bool = True, share_prompts: bool = False, lanes: bool = True
    ) -> list[list[int]]:
        """Row indices of the micro-batches a forward runs, every row in exactly one (each group sorted); no
        micro-batch computes more than ``token_budget`` tokens (``forward_tokens``) unless one row alone does.

        ``packed`` (the trainer's forwards run each micro-batch's rows without padding): the rows' read tokens
        in the fewest balanced bins of at most ``token_budget`` tokens (longest row first into the lightest bin,
        as verl's dynamic batch size balances them); with ``lanes`` (sdpa and eager attention, which run a
        micro-batch in lanes as wide as its longest row) a bin whose lanes would hold more than the budget is
        split further (``lane_tokens``).  With ``share_prompts`` the binned items are the rows that share a
        prompt (its tokens counted once), as many of them together as the budget allows.  Otherwise
        micro-batches whose padded size (rows × (prompt + response width)) fits the budget, rows grouped by
        length.  A single row larger than the budget forms its own micro-batch.
        """
        if packed and share_prompts:
            units = self.prompt_sharing_units(token_budget)
            unit_rows = [rows for rows, _ in units]
            segments = self.segment_cost(lanes)
            cost = lambda bin_units: segments([r for u in bin_units for r in unit_rows[u]])  # noqa: E731
            unit_bins = balanced_bins([tokens for _, tokens in units], token_budget, cost)
            return [sorted(r for u in unit_bin for r in unit_rows[u]) for unit_bin in unit_bins]
        if packed:
            lengths = self.read_lengths()
            cost = (lambda rows: lane_tokens([lengths[r] for r in rows])) if lanes else None
            return balanced_bins(lengths, token_budget, cost)
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

    def segment_cost(self, lanes: bool) -> Callable[[list[int]], int]:
        """Tokens a packed forward with shared prompts computes over some of this batch's rows: each group of
        them sharing a prompt read as one segment (the prompt once, then their responses), in lanes
        (``lane_tokens``) or as one sequence."""
        lengths, prompt_lengths = self.read_lengths(), self.prompt_mask.sum(1).tolist()
        groups = prompt_segments(self.prompt_ids, self.prompt_mask)
        prompt_of = {row: i for i, rows in enumerate(groups) for row in rows}

        def cost(rows: list[int]) -> int:
            segments: dict[int, int] = {}
            for row in rows:
                start = segments.get(prompt_of[row], prompt_lengths[row])
                segments[prompt_of[row]] = start + lengths[row] - prompt_lengths[row]
            return lane_tokens(list(segments.values())) if lanes else sum(segments.values())

        return cost

    def prompt_sharing_units(self, token_budget: float) -> list[tuple[list[int], int]]:
        """Rows that share a prompt, in runs of at most ``token_budget`` tokens when read as one segment (the
        prompt once, then each row's response; a row larger than the budget alone), with their tokens."""
        lengths, prompt_lengths = self.read_lengths(), self.prompt_mask.sum(1).tolist()
        units: list[tuple[list[int], int]] = []
        for rows in prompt_segments(self.prompt_ids, self.prompt_mask):
            current, tokens = [], prompt_lengths[rows[0]]
            for row in rows:
                response = lengths[row] - prompt_lengths[row]
                if current and tokens + response > token_budget:
                    units.append((current, tokens))
                    current, tokens = [], prompt_lengths[row]
                current.append(row)
                tokens += response
            units.append((current, tokens))
        return units

    def micro_batches(
        self,
        token_budget: int,
        device: torch.device | str = "cpu",
        packed: bool = True,
        share_prompts: bool = False,
        lanes: bool = True,
    ) -> list[RolloutBatch]:
        """The micro-batches of ``micro_batch_rows`` as batches, each moved to ``device`` (the batch
        itself stays where it is: one copy per micro-batch)."""
        groups = self.micro_batch_rows(token_budget, packed, share_prompts, lanes)
        return [self.select(rows).to(device) for rows in groups]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """This batch with every tensor on ``device`` (itself when they are there already)."""
        if torch.device(device) == self.prompt_ids.device:
            return self
        moved = {k: (v.to(device) if v is not None else None) for k, v in self._tensors().items()}
        return RolloutBatch(**moved, **self._records(lambda record: record.to(device)))


@dataclass
class ForwardTally:
    """What one pass's forwards over micro-batches computed, as summable metrics (per step, over ranks):
    ``perf/microbatches_<pass>``, ``perf/forward_tokens_<pass>`` and ``perf/padded_tokens_<pass>``, the
    tokens computed that no row reads (padding, and a data-parallel rank's filler forwards)."""

    name: str
    microbatches: int = 0
    computed: int = 0
    padded: int = 0

    def add(
        self, micro: RolloutBatch, filler: bool = False, packed: bool = True, share_prompts: bool = False,
        lanes: bool = True,
    ) -> None:  # fmt: skip
        computed = micro.forward_tokens(packed, share_prompts, lanes)
        self.microbatches += 1
        self.computed += computed
        self.padded += computed if filler else computed - sum(micro.segment_lengths(packed and share_prompts))

    def metrics(self) -> dict[str, float]:
        return {  # FORWARD_TALLY_PREFIXES
            f"perf/microbatches_{self.name}": float(self.microbatches),
            f"perf/forward_tokens_{self.name}": float(self.computed),
            f"perf/padded_tokens_{self.name}": float(self.padded),
        }


FORWARD_TALLY_PREFIXES = ("perf/microbatches_", "perf/forward_tokens_", "perf/padded_tokens_")


def padding_summary(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with its ``ForwardTally`` token counts replaced by the step's ``perf/forward_tokens``,
    ``perf/pad_fraction`` and ``perf/microbatches`` over every pass and each pass's ``perf/pad_fraction_<pass>``
    (its ``perf/microbatches_<pass>`` kept)."""
    passes = [k.removeprefix("perf/forward_tokens_") for k in metrics if k.startswith("perf/forward_tokens_")]
    if not passes:
        return metrics
    out = {k: v for k, v in metrics.items() if not k.startswith(("perf/forward_tokens_", "perf/padded_tokens_"))}
    computed = {p: metrics[f"perf/forward_tokens_{p}"] for p in passes}
    padded = {p: metrics[f"perf/padded_tokens_{p}"] for p in passes}
    out |= {f"perf/pad_fraction_{p}": padded[p] / max(1.0, computed[p]) for p in passes}
    out["perf/pad_fraction"] = sum(padded.values()) / max(1.0, sum(computed.values()))
    out["perf/microbatches"] = sum(metrics[f"perf/microbatches_{p}"] for p in passes)
    out["perf/forward_tokens"] = sum(computed.values())
    return out


RECORD_FIELDS = ("pool_window", "turns", "images")  # the RolloutBatch fields that hold a feature's record


@dataclass(frozen=True)
class RowRecord:
    """One feature's state on a ``RolloutBatch``: row i of each tensor belongs to sequence i, so the record
    selects, trims, concatenates and moves with the batch's rows.  Its tensors are per response token
    [B, T] (right-padded like the responses), except those ``ROW_FIELDS`` names: per row [B]."""

    ROW_FIELDS: ClassVar[tuple[str, ...]] = ()

    def _tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def select(self, index: Tensor) -> Self:
        """The rows ``index``."""
        return dataclasses.replace(self, **{k: v[index] for k, v in self._tensors().items()})

    def trimmed(self, response_len: int) -> Self:
        """The per-token tensors cut to the first ``response_len`` response columns."""
        tokens = {k: v[:, :response_len] for k, v in self._tensors().items() if k not in self.ROW_FIELDS}
        return dataclasses.replace(self, **tokens)

    def to(self, device: torch.device | str) -> Self:
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self._tensors().items()})

    @classmethod
    def concat(cls, records: Sequence[Self | None], lengths: Sequence[int]) -> Self:
        """The records of concatenated batches: rows stacked, per-token tensors right-padded to the widest.
        Every batch must have one (``lengths``, their row counts, is what an image record needs)."""
        if any(r is None for r in records):
            raise ValueError(f"cannot concatenate batches with and without a {cls.__name__}")
        columns = {f.name: [getattr(r, f.name) for r in records] for f in dataclasses.fields(cls)}
        joined = {k: torch.cat(v) if k in cls.ROW_FIELDS else _cat_padded(v, left=False) for k, v in columns.items()}
        return cls(**joined)


@dataclass(frozen=True)
class PoolWindow(RowRecord):
    """T-PPO (docs/algorithms.md): the state of a batch of the rollout pool's sequences after a window."""

    running: Tensor  # [B] bool: still generating (no stop token, under the cap)
    stale_mask: Tensor  # [B, T] bool: tokens generated in earlier windows, by older policies

    ROW_FIELDS: ClassVar[tuple[str, ...]] = ("running",)


@dataclass(frozen=True)
class TurnLabels(RowRecord):
    """Multi-turn conversations (PAG): what each generated token's turn is and earns."""

    rewards: Tensor  # [B, T] float: each generated turn's reward on its last token
    role_ids: Tensor  # [B, T] long: the role of each generated token (rollout.multiturn.conversations)
    turn_ids: Tensor  # [B, T] long: the generated turn of each token, -1 elsewhere


@dataclass(frozen=True)
class PromptImages:
    """A vision-language batch's images, once per distinct prompt (not once per sample, as a group's
    samples share their prompt): the I image prompts' pixel inputs, and each sequence's row of them."""

    vision: dict[str, Tensor]  # each [I, N, ...]: N images per prompt, zero-padded (a padding image)
    index: Tensor  # [B] long: each sequence's row of ``vision``; -1 = a text prompt

    @staticmethod
    def of(prompts: Sequence[Sequence[int]]) -> PromptImages | None:
        """The images of a batch whose row i has prompt ``prompts[i]`` (a group's samples share their prompt
        object, so its images are kept once); None when no prompt has images."""
        distinct: dict[int, ImagePrompt] = {}
        for prompt in prompts:
            if isinstance(prompt, ImagePrompt):
                distinct.setdefault(id(prompt), prompt)
        if not distinct:
            return None
        row = {key: i for i, key in enumerate(distinct)}
        keys = next(iter(distinct.values())).vision.keys()
        vision = {k: pad_images([p.vision[k][None] for p in distinct.values()]) for k in keys}
        return PromptImages(vision, torch.tensor([row.get(id(p), -1) for p in prompts], dtype=torch.long))

    @property
    def prompt_count(self) -> int:
        """I, the image prompts held."""
        return len(next(iter(self.vision.values())))

    def per_row(self) -> dict[str, Tensor]:
        """The model's image inputs, one entry per sequence (a text prompt's all zero: a padding image);
        empty when no row shows an image."""
        if not bool((self.index >= 0).any()):
            return {}
        rows, shows = self.index.clamp(min=0), self.index >= 0  # [B], [B]
        return {k: v[rows] * shows.view(-1, *[1] * (v.dim() - 1)).to(v.dtype) for k, v in self.vision.items()}

    def select(self, index: Tensor) -> PromptImages:
        """The rows ``index``, with the images of the prompts they show (in order) and no other."""
        shown = self.index[index]  # [b]
        kept = torch.unique(shown[shown >= 0])  # [i] the image prompts the rows show, in order
        remap = torch.full((self.prompt_count,), -1, dtype=torch.long, device=shown.device)
        remap[kept] = torch.arange(len(kept), device=shown.device)
        vision = {k: v[kept] for k, v in self.vision.items()}
        return PromptImages(vision, torch.where(shown >= 0, remap[shown.clamp(min=0)], shown))

    def trimmed(self, response_len: int) -> PromptImages:
        """Itself: images have no response columns."""
        return self

    def to(self, device: torch.device | str) -> PromptImages:
        return PromptImages({k: v.to(device) for k, v in self.vision.items()}, self.index.to(device))

    @classmethod
    def concat(cls, records: Sequence[PromptImages | None], lengths: Sequence[int]) -> PromptImages:
        """The images of concatenated batches (``lengths`` rows each; a batch with none is all text prompts):
        image rows stacked (the images per prompt zero-padded to the most), each batch's indices shifted
        past the rows before it."""
        keys = next(r.vision for r in records if r is not None).keys()
        parts: dict[str, list[Tensor]] = {k: [] for k in keys}
        indices, offset = [], 0
        for record, length in zip(records, lengths, strict=True):
            if record is None:
                indices.append(torch.full((length,), -1, dtype=torch.long))
                continue
            indices.append(torch.where(record.index >= 0, record.index + offset, record.index))
            offset += record.prompt_count
            for k in keys:
                parts[k].append(record.vision[k])
        return PromptImages({k: pad_images(v) for k, v in parts.items()}, torch.cat(indices))


BatchRecord = RowRecord | PromptImages


def _concat_records(records: Sequence[BatchRecord | None], lengths: Sequence[int]) -> BatchRecord | None:
    """One feature's record of concatenated batches (``lengths`` rows each); None when no batch has one."""
    present = next((r for r in records if r is not None), None)
    return None if present is None else type(present).concat(records, lengths)


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


def _cat_padded(values: Sequence[Tensor], left: bool) -> Tensor:
    """[B_j, W_j] tensors as one [ΣB_j, max W_j], each zero-padded on the left (prompts) or the right."""
    width = max(v.shape[1] for v in values)
    return torch.cat([_pad(v, width, left) for v in values])


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
