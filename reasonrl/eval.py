"""Evaluation: greedy pass@1, and avg@k / maj@k / pass@k over k sampled answers per problem."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from reasonrl.config.errors import ConfigError
from reasonrl.data.loaders import DataError, Fields
from reasonrl.data.source import DataSpec, benchmark_examples
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer
from reasonrl.reward.base import RewardResult
from reasonrl.reward.code import CodeVerifier
from reasonrl.reward.math import MathVerifier
from reasonrl.reward.router import RewardRouter, resolve_routes
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.sampling import FireParams
from reasonrl.train.rollout import PromptEncoder, sample_and_score

VERIFIERS = {"math": MathVerifier, "code": CodeVerifier}  # the task types eval scores, and their verifiers


@dataclass(frozen=True)
class EvalSettings:
    """What ``reasonrl eval`` runs."""

    model: str
    dataset: str
    k: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    limit: int | None = None
    prompt_template: str = "answer_line"
    seed: int = 0
    dtype: str = "auto"
    workers: int = 2
    timeout_seconds: float = 10.0
    fire: FireParams | None = None
    """FIRE for the k sampled answers (greedy_pass@1 stays greedy)."""
    fields: Fields = field(default_factory=Fields)
    """Where question and answer live in the rows of a jsonl/parquet file or a `datasets` name."""

    def check(self) -> None:
        """Refuse settings that cannot be evaluated, before anything loads."""
        checks = [
            (self.k >= 1, f"--k must be >= 1 (samples per problem), got {self.k}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0 (of the k samples), got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
        ]
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


def _vote_key(result: RewardResult) -> str | None:
    answer = result.info.get("extracted")
    if answer is None:
        return None
    cleaned = str(answer).strip().strip("$").replace(",", "")
    try:
        return str(Fraction(cleaned))
    except (ValueError, ZeroDivisionError):
        return cleaned


def majority_correct(results: list[RewardResult]) -> bool:
    """Whether the most frequent extracted answer (ties: the earliest) is correct."""
    keys = [_vote_key(r) for r in results]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    top = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == top)
    return next(r.correct for r, k in zip(results, keys, strict=True) if k == winner)


def sampled_metrics(per_problem: list[list[RewardResult]]) -> dict[str, float]:
    """avg@k (mean accuracy of all samples), maj@k (majority vote), pass@k (any sample correct)."""
    n = max(1, len(per_problem))
    return {
        "avg@k": sum(sum(r.correct for r in rs) / len(rs) for rs in per_problem) / n,
        "maj@k": sum(majority_correct(rs) for rs in per_problem) / n,
        "pass@k": sum(any(r.correct for r in rs) for rs in per_problem) / n,
    }


def run_eval(settings: EvalSettings) -> dict[str, Any]:
    """Evaluate a model spec on a dataset; returns the metrics (what ``reasonrl eval`` prints)."""
    settings.check()
    started = time.perf_counter()
    examples = benchmark_examples(settings.dataset, settings.limit, DataSpec(fields=settings.fields))
    unscorable = sorted({e.task_type for e in examples} - set(VERIFIERS))
    if unscorable:
        raise DataError(
            f"{settings.dataset} holds {', '.join(unscorable)} prompts, which only a judge can score; eval scores "
            f"tasks a program checks ({', '.join(VERIFIERS)}): give such a dataset"
        )
    tokenizer = load_tokenizer(settings.model)
    model = load_model(settings.model)
    engine = build_engine("auto", model, tokenizer, dtype=compute_dtype(settings.dtype))
    del model
    encoder = PromptEncoder(tokenizer, settings.prompt_template, max_prompt_tokens=10**9)
    # verifiable tasks by their task type: math answers, or code run against its tests in the sandbox
    verifiers = {task_type: make() for task_type, make in VERIFIERS.items()}
    pool = RewardRouter(resolve_routes(), verifiers, {}, workers=settings.workers, timeout=settings.timeout_seconds)
    try:
        greedy = sample_and_score(
            engine, tokenizer, pool, encoder, examples, SamplingParams(settings.max_new_tokens, temperature=0.0)
        )
        sampled = sample_and_score(
            engine,
            tokenizer,
            pool,
            encoder,
            examples,
            SamplingParams(
                settings.max_new_tokens, settings.temperature, settings.top_p, seed=settings.seed, fire=settings.fire
            ),
            repeats=settings.k,
        )
    finally:
        pool.close()
    groups = [sampled.results[i * settings.k : (i + 1) * settings.k] for i in range(len(examples))]
    return {
        "model": settings.model,
        "dataset": settings.dataset,
        "n": len(examples),
        "k": settings.k,
        "temperature": settings.temperature,
        "fire": settings.fire is not None,
        "greedy_pass@1": sum(r.correct for r in greedy.results) / max(1, len(examples)),
        **sampled_metrics(groups),
        "wall_seconds": time.perf_counter() - started,
    }
