"""The rollout engine protocol: token ids in; token ids, per-token log-probs and a finish reason out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from reasonrl.batch import ImagePrompt
from reasonrl.rollout.sampling import FireParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of completions."""

    max_new_tokens: int
    """Cap on generated tokens per completion; reaching it finishes with reason "length"."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""

    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""

    top_k: int | None = None
    """Sample among the k most likely tokens only; None = off."""

    seed: int | None = None
    """Seed of this call's sampling: the same seed, prompts and weights give the same completions.
    Each prompt samples from its own stream (``request_seed``), so a completion does not depend on the
    other prompts of the call (fast and vllm engines)."""

    first_index: int = 0
    """Index of this call's first prompt in the whole batch it belongs to: prompt i samples with
    ``request_seed(seed, first_index + i)``, so a data-parallel rank generating its share of a batch
    samples exactly what one process generating the whole batch would."""

    request_indices: tuple[int, ...] | None = None
    """Explicit stream index of each prompt of the call, in place of ``first_index + i``: a multi-turn
    driver generates a turn for a subset of its conversations, and each keeps its own stream."""

    fire: FireParams | None = None
    """FIRE: sample these response positions flaming-hot (fast engine only); None = off."""

    ignore_stop: bool = False
    """Generate exactly max_new_tokens, past stop tokens (throughput benchmarks only)."""


@dataclass(frozen=True)
class Completion:
    """One generated response."""

    token_ids: list[int]
    """Generated token ids, including the stop token when the completion stopped."""

    logprobs: list[float]
    """Log-probability of each generated token under the distribution it was drawn from: softmax of
    logits / temperature, restricted by top-k / top-p and renormalised (FIRE positions: FIRE's
    temperature and top-k).  Greedy: the plain softmax."""

    finish_reason: FinishReason
    """stop: a stop token was generated; length: max_new_tokens was reached first."""

    policy_versions: list[int] | None = None
    """The policy version that sampled each token, where a response spans several (asynchronous RL's
    partial rollouts); None: all of them the weights the engine held for the call."""


# request seed = call seed × this + prompt index: every copy of a prompt samples on its own
REQUEST_SEED_STRIDE = 100_003


def request_seed(params: SamplingParams, index: int) -> int | None:
    """The seed of prompt ``index`` (within the call) of a call sampled with ``params``; None = unseeded."""
    if params.seed is None:
        return None
    stream = params.first_index + index if params.request_indices is None else params.request_indices[index]
    return params.seed * REQUEST_SEED_STRIDE + stream


def share_params(params: SamplingParams, start: int, stop: int) -> SamplingParams:
    """The sampling parameters of prompts ``start:stop`` of a call, generated on their own: each keeps
    the stream it has in the whole call (how a batch is split among engines without changing a sample)."""
    if params.request_indices is not None:
        return dataclasses.replace(params, request_indices=params.request_indices[start:stop])
    return dataclasses.replace(params, first_index=params.first_index + start)


class RolloutEngine(Protocol):
    """What the trainer needs from a generation engine, its capabilities included: engines (and the wrappers
    around them, ``EngineWrapper``) subclass it and inherit the default of each capability they lack, so the
    trainer calls them all unconditionally and never probes for one."""

    stop_token_ids: frozenset[int]
    """Token ids that end a completion (included in it)."""

    shared_by_ranks: bool = False
    """Several trainer ranks share this engine (remote rollout workers): only rank 0 sends it weights."""

    max_batch_sequences: int | None = None
    """Sequences the engine decodes together at most; None: it decides (vLLM's scheduler)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in prompt order."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the served weights (after an optimiser step); an engine that sleeps wakes here."""
        ...

    def sleep(self) -> None:
        """Give the device memory the engine holds to the update (vLLM's sleep mode) until the next
        ``load_weights``; an engine without such memory has nothing to do."""


class EngineWrapper(RolloutEngine):
    """An engine around another (``engine``), changing some of what it does: every capability it does not
    change is the wrapped engine's, forwarded here by name."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine

    @property
    def stop_token_ids(self) -> frozenset[int]:  # type: ignore[override]
        return self.engine.stop_token_ids

    @property
    def shared_by_ranks(self) -> bool:  # type: ignore[override]
        return self.engine.shared_by_ranks

    @property
    def max_batch_sequences(self) -> int | None:  # type: ignore[override]
        return self.engine.max_batch_sequences

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self.engine.generate(prompts, params)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_weights(state_dict)

    def sleep(self) -> None:
        self.engine.sleep()


def stop_token_ids_of(model, tokenizer) -> frozenset[int]:
    """The token ids that end a completion of ``model``: its generation config's eos ids and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    return frozenset(stop)


def finish(token_ids: list[int], logprobs: list[float], stop_ids: frozenset[int], max_new_tokens: int) -> Completion:
    """Cut generated ids at the first stop token (kept) within the cap, and label the finish reason."""
    for i, token in enumerate(token_ids[:max_new_tokens]):
        if token in stop_ids:
            return Completion(token_ids[: i + 1], logprobs[: i + 1], "stop")
    return Completion(token_ids[:max_new_tokens], logprobs[:max_new_tokens], "length")


def extended(prompt: Sequence[int], tokens: Sequence[int]) -> list[int]:
    """``prompt`` followed by ``tokens``; a prompt with images keeps them."""
    return prompt.extended(tokens) if isinstance(prompt, ImagePrompt) else [*prompt, *tokens]


def first_token_fire(
    generate: Callable[[Sequence[Sequence[int]], SamplingParams], list[Completion]],
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
) -> list[Completion]:
    """FIRE as its authors run it on engines without per-position sampling: one call samples the
    first token flaming-hot, a second continues from it with the regular settings."""
    fire = params.fire
    if fire is None or fire.positions != (0,):
        raise ValueError("this engine applies FIRE to the first token only; use the fast engine for other positions")
    hot = dataclasses.replace(
        params, max_new_tokens=1, temperature=fire.temperature, top_p=1.0, top_k=fire.top_k, fire=None
    )
    firsts = generate(prompts, hot)
    rest = dataclasses.replace(params, max_new_tokens=params.max_new_tokens - 1, fire=None)
    pending = [i for i, c in enumerate(firsts) if c.finish_reason == "length" and params.max_new_tokens > 1]
    tails = generate([extended(prompts[i], firsts[i].token_ids) for i in pending], rest) if pending else []
    merged = list(firsts)
    for i, tail in zip(pending, tails, strict=True):
        merged[i] = Completion(
            firsts[i].token_ids + tail.token_ids, firsts[i].logprobs + tail.logprobs, tail.finish_reason
        )
    return merged
