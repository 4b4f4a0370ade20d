"""Evaluation: greedy pass@1, and avg@k / maj@k / pass@k over n ≥ k sampled answers per problem,
overall and per data source."""

from __future__ import annotations

import math
import time
from collections import Counter
from fractions import Fraction
from typing import Any

from reasonrl.config.commands import EvalSettings
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError, Fields
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

VERIFIERS = {"math": MathVerifier, "code": CodeVerifier}  # the task types eval scores, and their verifiers


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


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are correct (Chen et al. 2021,
    arXiv:2107.03374, eq. 1): 1 − C(n−c, k) / C(n, k), the chance that k of the n drawn without
    replacement include a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sampled_metrics(per_problem: list[list[RewardResult]], k: int | None = None) -> dict[str, float]:
    """Over each problem's n samples: avg@k (mean accuracy of all n, an unbiased estimate of a k-sample
    mean), maj@k (the majority vote of the first k) and pass@k (the unbiased estimator from n); ``k``
    defaults to n, where pass@k is "any sample correct"."""
    count = max(1, len(per_problem))
    return {
        "avg@k": sum(sum(r.correct for r in rs) / len(rs) for rs in per_problem) / count,
        "maj@k": sum(majority_correct(rs[: k or len(rs)]) for rs in per_problem) / count,
        "pass@k": sum(pass_at_k(len(rs), sum(r.correct for r in rs), k or len(rs)) for rs in per_problem) / count,
    }


def per_source_metrics(
    examples: list[Example], greedy: list[RewardResult], per_problem: list[list[RewardResult]], k: int
) -> dict[str, dict[str, float]]:
    """The metrics of each data source (the row's ``data_source``, else the dataset's name) on its own."""
    rows: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        rows.setdefault(example.data_source or "unknown", []).append(i)
    return {
        source: {
            "n": len(indices),
            "greedy_pass@1": sum(greedy[i].correct for i in indices) / len(indices),
            **sampled_metrics([per_problem[i] for i in indices], k),
        }
        for source, indices in rows.items()
    }


def run_eval(settings: EvalSettings) -> dict[str, Any]:
    """Evaluate a model spec on a dataset; returns the metrics (what ``reasonrl eval`` prints)."""
    settings.check()
    started = time.perf_counter()
    fields = Fields(settings.question_field, settings.answer_field)
    examples = benchmark_examples(settings.dataset, settings.limit, DataSpec(fields=fields))
    unscorable = sorted({e.task_type for e in examples} - set(VERIFIERS))
    if unscorable:
        raise DataError(
            f"{settings.dataset} holds {', '.join(unscorable)} prompts, which only a judge can score; eval scores "
            f"tasks a program checks ({', '.join(VERIFIERS)}): give such a dataset"
        )
    samples = settings.samples or settings.k
    tokenizer = load_tokenizer(settings.model)
    model = load_model(settings.model)
    engine = build_engine("auto", model, tokenizer, dtype=compute_dtype(settings.dtype))
    del model
    encoder = PromptEncoder(tokenizer, settings.prompt_template, 10**9, settings.system_prompt)
    # verifiable tasks by their task type: math answers, or code run against its tests in the sandbox
    verifiers = {task_type: make() for task_type, make in VERIFIERS.items()}
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
        sampled = sample_and_score(engine, tokenizer, pool, encoder, examples, sampled_params, repeats=samples)
    finally:
        pool.close()
    groups = [sampled.results[i * samples : (i + 1) * samples] for i in range(len(examples))]
    return {
        "model": settings.model,
        "dataset": settings.dataset,
        "n": len(examples),
        "k": settings.k,
        "temperature": settings.temperature,
        "fire": settings.fire.enabled,
        "samples": samples,
        "greedy_pass@1": sum(r.correct for r in greedy.results) / max(1, len(examples)),
        **sampled_metrics(groups, settings.k),
        "per_source": per_source_metrics(examples, greedy.results, groups, settings.k),
        "wall_seconds": time.perf_counter() - started,
    }
