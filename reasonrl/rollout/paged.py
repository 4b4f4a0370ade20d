"""A GPU engine for machines without vLLM: transformers' own continuous batching (``generate_batch``: a paged KV
cache, a finished answer's slot refilled with the next request, repeated prompts sharing their cache blocks) on
the engine's own copy of the policy.  TRL exposes the same machinery as ``use_transformers_paged``.

What it honours as the other engines do: temperature, top-k, top-p, the answer cap, stop tokens (kept in the
answer), the log-prob of each token under the distribution it was drawn from (transformers returns it after its
temperature / top-k / top-p processors), seeds (one per call, as the hf engine's: the same seed, prompts and
weights give the same answers), FIRE on the first token (two calls, ``first_token_fire``), and weights
replaced in place between steps.  Text only: a prompt that carries images is refused (the hf or vllm engine
serves vision-language models).

The KV cache is sized for each call's requests (their prompts plus the answer cap), never "what the GPU has
free": the trainer's update shares the device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from reasonrl.models.model_error import ModelError
from reasonrl.rollout.engine_protocol import Completion, SamplingParams, finish, first_token_fire, request_seed
from reasonrl.rollout.hf import HFEngine

PAGE_TOKENS = 256  # tokens of one cache page (transformers' default)
PREFILL_TOKENS = 4096  # tokens one forward pass takes at most (prompts are prefilled in chunks of it)


def continuous_batching_config() -> tuple[type, str]:
    """transformers' ``ContinuousBatchingConfig`` class and the name of its page-size field (``block_size`` before
    transformers 5.18, ``page_size`` since), refused with its reason where this transformers lacks what the engine
    needs (continuous batching that returns log-probs and takes a seed)."""
    import transformers

    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        ContinuousBatchingConfig = None
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)} if ContinuousBatchingConfig else set()
    pages = [name for name in ("page_size", "block_size") if name in fields]
    needed = {"return_logprobs", "seed", "num_blocks", "max_batch_tokens", "max_requests_per_batch"}
    if not needed <= fields or not pages:
        raise ModelError(
            f"rollout.engine=paged needs transformers' continuous batching with log-probs and seeds, which "
            f"transformers {transformers.__version__} lacks; use rollout.engine=hf (or vllm)"
        )
    return ContinuousBatchingConfig, pages[0]


def cache_settings(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, page_field: str, max_batch_sequences: int
) -> dict[str, int]:
    """The paged cache of one call: pages for every request's prompt and answer cap (without the sharing of
    repeated prompts' blocks, which only frees pages), prefill chunks of PREFILL_TOKENS, at most
    ``max_batch_sequences`` requests decoding together; ``page_field``: the name of the page size here."""
    pages = sum(math.ceil((len(p) + max_new_tokens) / PAGE_TOKENS) for p in prompts)
    return {
        page_field: PAGE_TOKENS,
        "num_blocks": pages + 1,
        "max_batch_tokens": max(PREFILL_TOKENS, max(len(p) for p in prompts) + 1),
        "max_requests_per_batch": max_batch_sequences,
    }


class PagedEngine(HFEngine):
    """transformers' ``generate_batch`` (continuous batching, paged attention) behind the engine protocol, on the
    hf engine's copy of the policy (its weights loaded in place, its stop and pad tokens)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: torch.dtype | None = None,
        max_batch_sequences: int = 256,
    ) -> None:
        # refused here, before any copy of the weights
        self.config_class, self.page_field = continuous_batching_config()
        if hasattr(model.config, "vision_config"):
            raise ModelError("rollout.engine=paged is text-only; a vision-language model generates with hf or vllm")
        super().__init__(model, tokenizer, dtype=dtype, max_batch_sequences=max_batch_sequences)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Completions in prompt order."""
        if any(getattr(p, "vision", None) is not None for p in prompts):
            raise ValueError("rollout.engine=paged is text-only; a prompt with images generates with hf or vllm")
        if params.fire:
            return first_token_fire(self._generate, prompts, params)
        return self._generate(prompts, params)

    @torch.no_grad()
    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        sample = params.temperature > 0
        stop_ids = frozenset() if params.ignore_stop else self.stop_token_ids
        generation = GenerationConfig(
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample and params.top_p < 1.0 else None,
            top_k=params.top_k if sample else None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=sorted(stop_ids) or None,
            pad_token_id=self.pad_token_id,
        )
        batching = self.config_class(
            return_logprobs=True,
            seed=request_seed(params, 0),  # the call's stream: another share of a batch, another seed
            **cache_settings(prompts, params.max_new_tokens, self.page_field, self.max_batch_sequences),
        )
        outputs = self.model.generate_batch(
            [list(p) for p in prompts],
            generation_config=generation,
            continuous_batching_config=batching,
            progress_bar=False,
            warmup=False,
        )
        by_index = {int(request.removeprefix("req_")): output for request, output in outputs.items()}
        if sorted(by_index) != list(range(len(prompts))):
            raise RuntimeError(f"transformers' generate_batch answered {len(by_index)} of {len(prompts)} requests")
        failed = [output.error for output in by_index.values() if output.error]
        if failed:
            raise RuntimeError(f"transformers' generate_batch failed {len(failed)} request(s): {failed[0]}")
        return [
            finish(list(by_index[i].generated_tokens), list(by_index[i].logprobs), stop_ids, params.max_new_tokens)
            for i in range(len(prompts))
        ]
