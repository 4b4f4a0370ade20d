"""The reference engine: transformers ``generate`` on the engine's own copy of the policy.

It also serves vision-language models: a prompt that carries images (``ImagePrompt``) generates from its
pixel inputs, and a prompt holding image tokens without the images to fill them is refused."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.batch import pad_images
from reasonrl.models.varlen_attention import LANE_ATTENTION, VARLEN_ATTENTION
from reasonrl.rollout.engine_protocol import (
    Completion,
    RolloutEngine,
    SamplingParams,
    finish,
    first_token_fire,
    request_seed,
    stop_token_ids_of,
)
from reasonrl.rollout.sampling import sampling_logprobs


class _LogprobRecorder(LogitsProcessor):
    """Records the log-prob of each sampled token under the distribution it was drawn from.

    transformers applies user processors before its temperature / top-k / top-p warpers, so
    ``scores`` here are the raw logits and the same filtering is re-applied to them
    (``sampling_logprobs``).  The token sampled at step t is only known at step t+1 (as the last
    input id), so one step of log-probs is kept in hand.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.pending: torch.Tensor | None = None  # [B, V] log-probs of the step whose token is unknown yet
        self.recorded: list[torch.Tensor] = []  # per step: [B]

    def _take(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.recorded.append(self.pending.gather(1, tokens[:, None]).squeeze(1))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])
        p = self.params
        self.pending = sampling_logprobs(scores, p.temperature, p.top_k, p.top_p)
        return scores

    def finalize(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs, given the tokens sampled at the last step."""
        self._take(last_tokens)
        return torch.stack(self.recorded, dim=1)


class HFEngine(RolloutEngine):
    """Batched ``model.generate`` with left padding and explicit attention masks."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        max_batch_sequences: int = 64,
    ) -> None:
        self.model = copy.deepcopy(model).to(dtype or next(model.parameters()).dtype).eval()
        if self.model.config._attn_implementation in (VARLEN_ATTENTION, LANE_ATTENTION):  # the trainer's packed kernels
            self.model.set_attn_implementation("sdpa")  # SDPA here (continuous batching refuses an unknown one)
        self.max_batch_sequences = max_batch_sequences
        self.stop_token_ids = stop_token_ids_of(self.model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_token_ids)
        self.image_token_id = getattr(self.model.config, "image_token_id", None)  # a VLM's image placeholder

    def _vision_inputs(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """The pixel inputs of a chunk's prompts, one entry per prompt (a text prompt's all zero: Idefics3
        skips such padding images); empty when no prompt shows an image."""
        shown = [getattr(p, "vision", None) for p in prompts]
        for prompt, vision in zip(prompts, shown, strict=True):
            if vision is None and self.image_token_id is not None and self.image_token_id in prompt:
                raise ValueError("a prompt holds image tokens but carries no images; encode it with the processor")
        if all(v is None for v in shown):
            return {}
        template = next(v for v in shown if v is not None)
        rows = [v if v is not None else {k: t[:0] for k, t in template.items()} for v in shown]
        return {k: pad_images([r[k][None] for r in rows]) for k in template}

    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy trainer weights into the served model, casting to its dtype."""
        own = self.model.state_dict()
        for name, tensor in state_dict.items():
            own[name].copy_(tensor)

    @torch.no_grad()
    def _generate_chunk(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: the last prompt token sits at width - 1
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        device = next(self.model.parameters()).device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        vision = {k: v.to(device) for k, v in self._vision_inputs(prompts).items()}
        recorder = _LogprobRecorder(params)
        sample = params.temperature > 0
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **vision,
            suppress_tokens=[self.image_token_id] if self.image_token_id is not None else None,
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=(params.top_k or 0) if sample else None,
            eos_token_id=sorted(self.stop_token_ids),
            pad_token_id=self.pad_token_id,
            logits_processor=[recorder],
            min_new_tokens=params.max_new_tokens if params.ignore_stop else None,
        )
        generated = output[:, width:]  # [B, steps]
        logprobs = recorder.finalize(generated[:, -1]).cpu()  # [B, steps]
        generated = generated.cpu()
        stop_ids = frozenset() if params.ignore_stop else self.stop_token_ids
        return [
            finish(ids, lps, stop_ids, params.max_new_tokens)
            for ids, lps in zip(generated.tolist(), logprobs.tolist(), strict=True)
        ]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Completions in prompt order; prompts are batched by length to limit padding."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        with torch.random.fork_rng():
            if params.seed is not None:
                torch.manual_seed(request_seed(params, 0))  # the call's stream: another share, another seed
            for start in range(0, len(order), self.max_batch_sequences):
                chunk = order[start : start + self.max_batch_sequences]
                chunk_prompts = [prompts[i] for i in chunk]
                if params.fire:
                    completions = first_token_fire(self._generate_chunk, chunk_prompts, params)
                else:
                    completions = self._generate_chunk(chunk_prompts, params)
                for index, completion in zip(chunk, completions, strict=True):
                    results[index] = completion
        return results  # type: ignore[return-value]
