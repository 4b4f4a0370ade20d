"""Sample completions of some prompts and score them: the step shared by the rollout stage,
evaluation and Pre-PPO prompt selection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reasonrl.data.examples import Example
from reasonrl.data.prompts import PromptEncoder
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext
from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams
from reasonrl.timing import timed


@dataclass
class Scored:
    """Completions of some prompts, with their verdicts."""

    examples: list[Example]  # one per completion
    prompts: list[list[int]]
    completions: list[Completion]
    results: list[RewardResult]

    def rows(self, rows: slice) -> Scored:
        """The completions ``rows``."""
        return Scored(self.examples[rows], self.prompts[rows], self.completions[rows], self.results[rows])

    @staticmethod
    def concat(parts: Sequence[Scored]) -> Scored:
        """The completions of ``parts``, in order."""
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
    timing: dict[str, float] | None = None,
    step: int = 0,
    max_steps: int = 0,
) -> Scored:
    """Generate ``repeats`` completions per example (consecutive) and score them (the scorer sees their token ids
    and the run's ``step`` of ``max_steps``: ``ScoringContext``); the seconds spent go to ``timing``'s
    ``perf/generate_seconds`` and ``perf/score_seconds``."""
    timing = {} if timing is None else timing
    kept = [e for e in examples if encoder(e) is not None]
    expanded = [e for e in kept for _ in range(repeats)]
    prompts = [encoder(e) for e in expanded]
    with timed(timing, "perf/generate_seconds"):
        completions = engine.generate(prompts, params) if prompts else []
    with timed(timing, "perf/score_seconds"):
        # (a tokenizer may decode an empty batch to one empty text)
        texts = (
            tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True) if completions else []
        )
        context = ScoringContext(tuple(tuple(c.token_ids) for c in completions), step, max_steps)
        results = pool.score_examples(expanded, texts, context)
    return Scored(expanded, prompts, completions, results)  # type: ignore[arg-type]
