"""Sample completions of some prompts and score them: the step shared by the rollout stage,
evaluation and Pre-PPO prompt selection."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from reasonrl.data.examples import Example
from reasonrl.data.prompts import PromptEncoder
from reasonrl.reward.base import RewardResult, Scorer
from reasonrl.rollout.base import Completion, RolloutEngine, SamplingParams


@dataclass
class Scored:
    """Completions of some prompts, with their verdicts."""

    examples: list[Example]  # one per completion
    prompts: list[list[int]]
    completions: list[Completion]
    results: list[RewardResult]
    generate_seconds: float = 0.0
    score_seconds: float = 0.0

    def rows(self, rows: slice) -> Scored:
        """The completions ``rows`` (timing not included)."""
        return Scored(self.examples[rows], self.prompts[rows], self.completions[rows], self.results[rows])

    @staticmethod
    def concat(parts: Sequence[Scored]) -> Scored:
        """The completions of ``parts``, in order (timing not included)."""
        return Scored(
            [e for p in parts for e in p.examples],
            [q for p in parts for q in p.prompts],
            [c for p in parts for c in p.completions],
            [r for p in parts for r in p.results],
        )


def sample_and_score(
    engine: RolloutEngine,
    tokenizer,
    pool: Scorer,
    encoder: PromptEncoder,
    examples: Sequence[Example],
    params: SamplingParams,
    repeats: int = 1,
) -> Scored:
    """Generate ``repeats`` completions per example (consecutive) and score them."""
    kept = [e for e in examples if encoder(e) is not None]
    expanded = [e for e in kept for _ in range(repeats)]
    prompts = [encoder(e) for e in expanded]
    start = time.perf_counter()
    completions = engine.generate(prompts, params) if prompts else []
    generated = time.perf_counter()
    texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    results = pool.score_examples(expanded, texts)
    scored_at = time.perf_counter()
    return Scored(expanded, prompts, completions, results, generated - start, scored_at - generated)  # type: ignore[arg-type]
