"""What a rollout batch's responses did, as step metrics: scoring errors, finished sequences, the
engine's fullness, and per source, per ground-truth kind and per reward function (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.reward.verifier_protocol import RewardResult
from reasonrl.rollout.tppo_pool import idle_slot_steps, slot_utilisation


def scoring_errors(results: Sequence[RewardResult]) -> dict[str | None, list[str]]:
    """The errors in ``results`` by scorer: with ``reward.functions`` each term's (every term listed,
    failed or not), else the built-in scorer's under None."""
    errors: dict[str | None, list[str]] = {}
    for result in results:
        if "terms" in result.info:
            for name in result.info["terms"]:
                errors.setdefault(name, [])
            for name, error in result.info["term_errors"].items():
                errors[name].append(error)
        else:
            builtin = errors.setdefault(None, [])
            if "error" in result.info:
                builtin.append(result.info["error"])
    return errors


def finished_stats(batch: RolloutBatch, finished: torch.Tensor, results: Sequence[RewardResult]) -> dict[str, float]:
    """Reward, accuracy, length and truncation of the batch's ``finished`` rows ([B] bool; NaN when none
    finished), and the per-source scores of their ``results``."""
    lengths = batch.response_mask.sum(1).float()[finished]
    if not finished.any():
        keys = ("reward/mean", "reward/accuracy", "rollout/response_length", "rollout/response_length_max")
        return {**dict.fromkeys((*keys, "rollout/truncated_fraction"), float("nan")), **source_stats(results)}
    return {
        "reward/mean": batch.rewards[finished].mean().item(),
        "reward/accuracy": batch.correct[finished].float().mean().item(),
        "rollout/response_length": lengths.mean().item(),
        "rollout/response_length_max": lengths.max().item(),
        "rollout/truncated_fraction": batch.truncated[finished].float().mean().item(),
        **source_stats(results),
    }


def fullness_stats(calls: Sequence[Sequence[int]]) -> dict[str, float]:
    """How full the generation batch stayed over some engine calls (tokens per completion, per call):
    ``rollout/slot_utilisation`` (tokens ÷ slot-steps) and ``rollout/underfull_step_fraction``
    (decode steps with an idle slot ÷ all decode steps), weighted by each call's decode steps, and
    ``rollout/idle_slot_steps``, their count of idle slot-steps."""
    steps = [max(c, default=0) for c in calls]
    total = sum(steps)
    idle = {"rollout/idle_slot_steps": float(sum(idle_slot_steps(list(c)) for c in calls))}
    if not total:
        return {"rollout/slot_utilisation": 1.0, "rollout/underfull_step_fraction": 0.0, **idle}
    shares = [slot_utilisation(list(c)) for c in calls]
    return {
        **idle,
        "rollout/slot_utilisation": sum(s * u for s, (u, _) in zip(steps, shares, strict=True)) / total,
        "rollout/underfull_step_fraction": sum(s * f for s, (_, f) in zip(steps, shares, strict=True)) / total,
    }


def source_stats(results: Sequence[RewardResult]) -> dict[str, float]:
    """Per reward source (results routed by the reward router): mean raw score and share of the batch."""
    by_source: dict[str, list[float]] = {}
    for result in results:
        if "source" in result.info:
            by_source.setdefault(result.info["source"], []).append(result.score)
    stats = {}
    for source, scores in by_source.items():
        stats[f"reward/{source}/mean"] = sum(scores) / len(scores)
        stats[f"reward/{source}/fraction"] = len(scores) / len(results)
    return stats | ground_truth_stats(results, "reward") | function_stats(results)


def ground_truth_stats(results: Sequence[RewardResult], prefix: str) -> dict[str, float]:
    """Judged responses checked against a true answer (``info["verifier_correct"]``): the rule verifier's
    accuracy, the gap between the judge's mean score and it, and the share the judge calls correct that the
    verifier finds wrong (reward hacking grows both; the gap's level depends on the judge's scale, a GenRM
    scoring a right answer near 0.5, so read its trend); empty without any."""
    checked = [r for r in results if "verifier_correct" in r.info]
    if not checked:
        return {}
    accuracy = sum(r.info["verifier_correct"] for r in checked) / len(checked)
    fooled = sum(r.correct and not r.info["verifier_correct"] for r in checked) / len(checked)
    return {
        f"{prefix}/verifier_accuracy": accuracy,
        f"{prefix}/judge_minus_verifier": sum(r.score for r in checked) / len(checked) - accuracy,
        f"{prefix}/judge_fooled": fooled,
    }


def function_stats(results: Sequence[RewardResult]) -> dict[str, float]:
    """Per term of ``reward.functions``: its mean value (samples it returned None for left out; an error
    counts as 0) and the share of samples it failed on (raised, timed out or died)."""
    values: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for result in results:
        for name, value in result.info.get("terms", {}).items():
            values.setdefault(name, [])
            if value is not None:
                values[name].append(value)
        for name in result.info.get("term_errors", ()):
            errors[name] = errors.get(name, 0) + 1
    stats = {}
    for name, scored in values.items():
        stats[f"reward/fn/{name}/mean"] = sum(scored) / len(scored) if scored else float("nan")
        stats[f"reward/fn/{name}/error_fraction"] = errors.get(name, 0) / len(results)
    return stats
