"""A scripted engine for tests: responses come from a function of the prompt and a seeded RNG."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

import torch

from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams, finish

Responder = Callable[[list[int], random.Random], list[int]]


class FakeEngine(RolloutEngine):
    """Deterministic stand-in for a real engine.

    ``respond(prompt_ids, rng)`` returns the token ids to emit (a stop token ends the completion).
    With temperature 0 the RNG is seeded with 0 whatever ``params.seed`` is (greedy is
    deterministic); otherwise with ``params.seed``.  Every token gets log-prob ``logprob``.
    """

    def __init__(self, respond: Responder, stop_token_ids: Sequence[int], logprob: float = -1.0) -> None:
        self.respond = respond
        self.stop_token_ids = frozenset(stop_token_ids)
        self.logprob = logprob
        self.weight_updates = 0

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Counts updates; a scripted engine has no weights."""
        self.weight_updates += 1

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One scripted completion per prompt."""
        rng = random.Random(0 if params.temperature == 0 else params.seed)
        completions = []
        for prompt in prompts:
            ids = list(self.respond(list(prompt), rng))
            stop_ids = frozenset() if params.ignore_stop else self.stop_token_ids
            completions.append(finish(ids, [self.logprob] * len(ids), stop_ids, params.max_new_tokens))
        return completions
