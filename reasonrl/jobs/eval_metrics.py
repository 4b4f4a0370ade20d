"""The evaluation's metrics over each problem's scored samples: avg@k, maj@k, pass@k (Chen et al. 2021),
each data source on its own, and PAG's (arXiv 2506.10406 §4).  Pure functions of the results."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

from reasonrl.algo.pag import VERDICT_CORRECT, VERDICT_WRONG
from reasonrl.data.examples import Example
from reasonrl.reward.verifier_protocol import RewardResult


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
            "problems": len(indices),
            "greedy_pass@1": sum(greedy[i].correct for i in indices) / len(indices),
            **sampled_metrics([per_problem[i] for i in indices], k),
        }
        for source, indices in rows.items()
    }


def pag_metrics(attempts_correct: list[list[bool]], verdicts: list[list[int]]) -> dict[str, float]:
    """PAG's evaluation metrics (arXiv 2506.10406 §4) from each problem's attempts (their truth, in order)
    and the verdicts of its verify turns (verdict j judges attempt j): acc@t1, acc@final; the verdicts
    that match the truth of the attempt they judge (an unparsed verdict matches nothing); the fractions
    of problems turned from incorrect to correct and from correct to incorrect; the fraction revised."""
    n = max(1, len(attempts_correct))
    judged = [
        (v, attempts[j]) for attempts, vs in zip(attempts_correct, verdicts, strict=True) for j, v in enumerate(vs)
    ]
    right = sum((v == VERDICT_CORRECT and truth) or (v == VERDICT_WRONG and not truth) for v, truth in judged)
    return {
        "acc@t1": sum(a[0] for a in attempts_correct) / n,
        "acc@final": sum(a[-1] for a in attempts_correct) / n,
        "verifier_accuracy": right / len(judged) if judged else float("nan"),
        "delta_i_to_c": sum(not a[0] and a[-1] for a in attempts_correct) / n,
        "delta_c_to_i": sum(a[0] and not a[-1] for a in attempts_correct) / n,
        "revision_rate": sum(len(a) > 1 for a in attempts_correct) / n,
    }
