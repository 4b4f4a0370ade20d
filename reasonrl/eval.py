"""Evaluation: pass@1 (greedy), and avg@k / maj@k / pass@k over k sampled answers per problem."""

from __future__ import annotations

import time
from collections import Counter
from fractions import Fraction
from typing import Any

from reasonrl.config.commands import EvalSettings
from reasonrl.data.loaders import Fields
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import DataSpec, benchmark_examples
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer
from reasonrl.reward.base import RewardResult
from reasonrl.reward.code import CodeVerifier
from reasonrl.reward.math import MathVerifier
from reasonrl.reward.router import RewardRouter, resolve_routes
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.sampling import fire_params
from reasonrl.rollout.scored import sample_and_score


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
    started = time.perf_counter()
    tokenizer = load_tokenizer(settings.model)
    model = load_model(settings.model)
    engine = build_engine("auto", model, tokenizer, dtype=compute_dtype(settings.dtype))
    del model
    examples = benchmark_examples(settings.dataset, settings.limit, DataSpec(fields=Fields()))
    encoder = PromptEncoder(tokenizer, settings.prompt_template, max_prompt_tokens=10**9)
    # verifiable tasks by their task type: math answers, or code run against its tests in the sandbox
    verifiers = {"math": MathVerifier(), "code": CodeVerifier()}
    pool = RewardRouter(resolve_routes(), verifiers, {}, workers=settings.workers, timeout=settings.timeout_seconds)
    greedy_params = SamplingParams(settings.max_new_tokens, temperature=0.0)
    sampled_params = SamplingParams(
        settings.max_new_tokens,
        settings.temperature,
        settings.top_p,
        seed=settings.seed,
        fire=fire_params(settings.fire),
    )
    try:
        greedy = sample_and_score(engine, tokenizer, pool, encoder, examples, greedy_params)
        sampled = sample_and_score(engine, tokenizer, pool, encoder, examples, sampled_params, repeats=settings.k)
    finally:
        pool.close()
    groups = [sampled.results[i * settings.k : (i + 1) * settings.k] for i in range(len(examples))]
    return {
        "model": settings.model,
        "dataset": settings.dataset,
        "n": len(examples),
        "k": settings.k,
        "temperature": settings.temperature,
        "fire": settings.fire.enabled,
        "pass@1": sum(r.correct for r in greedy.results) / max(1, len(examples)),
        **sampled_metrics(groups),
        "wall_seconds": time.perf_counter() - started,
    }
