"""Pre-PPO prompt selection (Data-Scaling RLHF, arXiv 2503.22230 §4).

Sample responses to every candidate prompt with the initial policy, score them with the reward
(the router: verifiers, GenRM or the Bradley-Terry model), z-normalise the mean score per prompt
within its domain (task type: score scales differ by domain), keep the lowest-scoring p% — the
hardest, least hackable prompts — and merge them into the base set.  `reasonrl data select`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from reasonrl.algo.preference import domain_zscores
from reasonrl.config import load_config
from reasonrl.data.examples import Example
from reasonrl.jobs.prompt_sampling import SCORING_CHUNK, InitialPolicy, prompt_rows, write_jsonl
from reasonrl.reward.router import build_router
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.scored import sample_and_score
from reasonrl.timing import Progress


@dataclass(frozen=True, kw_only=True)
class PromptSelectionRun:
    """What ``reasonrl data select`` runs."""

    candidates: str
    """Candidate prompts: a dataset name or jsonl."""

    base: str | None = None
    """The base prompt set the selection is merged into."""

    out: str
    """The merged jsonl to write."""

    fraction: float = 0.1
    """Share of candidates kept (paper: 10%)."""

    samples: int = 4
    """Responses sampled per candidate prompt."""

    max_new_tokens: int = 64
    """Cap on a sampled response's tokens."""

    split: Literal["auto", "train", "test"] = "auto"
    """Split of built-in datasets (auto: train where there is one, else the only split, as math500's test)."""

    limit: int | None = None
    """Score the first N candidates only."""

    overrides: tuple[str, ...] = ()
    """Config overrides: model.name_or_path, reward.* ..."""


def select_hardest(candidates: Sequence[Example], scores: Sequence[float | None], fraction: float) -> list[Example]:
    """The ``fraction`` of the scored candidates with the lowest within-domain z-score (ties: first in order).

    A candidate scored ``None`` (never sampled: its prompt is over ``rollout.max_prompt_tokens``) is
    left out of its domain's mean and standard deviation and is never selected.  Invariant to any
    per-domain affine rescaling a·s + b (a > 0) of the scores.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"the kept fraction must be in (0, 1], got {fraction}")
    scored = [i for i, s in enumerate(scores) if s is not None]
    z = domain_zscores(
        torch.tensor([scores[i] for i in scored], dtype=torch.float64), [candidates[i].task_type for i in scored]
    )
    keep = math.ceil(fraction * len(scored))
    order = sorted(range(len(scored)), key=lambda k: (z[k].item(), scored[k]))
    return [candidates[i] for i in sorted(scored[k] for k in order[:keep])]


def merge(base: Sequence[Example], selected: Sequence[Example]) -> list[Example]:
    """The base set followed by the selected prompts it does not already hold (by question text)."""
    seen = {e.question for e in base}
    return [*base, *(e for e in selected if e.question not in seen)]


def mean_prompt_scores(
    engine,
    tokenizer,
    scorer,
    encoder,
    examples: Sequence[Example],
    samples: int,
    max_new_tokens: int,
    seed: int,
    on_progress: Callable[[int], None] | None = None,
) -> list[float | None]:
    """Mean reward of ``samples`` sampled responses per prompt under the current (initial) policy;
    None for a prompt the encoder skipped (longer than ``rollout.max_prompt_tokens``).
    ``on_progress`` is told how many prompts each chunk scored."""
    totals: dict[str, list[float]] = {}
    for start in range(0, len(examples), SCORING_CHUNK):
        chunk = examples[start : start + SCORING_CHUNK]
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed + start)
        scored = sample_and_score(engine, tokenizer, scorer, encoder, chunk, params, samples)
        for example, result in zip(scored.examples, scored.results, strict=True):
            totals.setdefault(example.id, []).append(result.score)
        if on_progress is not None:
            on_progress(len(chunk))
    return [sum(totals[e.id]) / len(totals[e.id]) if e.id in totals else None for e in examples]


def run_selection(settings: PromptSelectionRun, progress: bool | None = False) -> dict:
    """Score the first ``limit`` rows of the candidates with the initial policy and the run's reward router,
    keep the hardest ``fraction``, merge them into the base set and write ``out``; returns a summary.
    ``split`` picks the split of both sources (auto: train where a dataset has one, else its only split);
    ``progress``: show the scoring on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    cfg = load_config(None, list(settings.overrides))
    candidates = prompt_rows(cfg, settings.candidates, settings.split, settings.limit)
    base = prompt_rows(cfg, settings.base, settings.split) if settings.base else []
    policy = InitialPolicy.load(cfg)
    scorer = build_router(policy.cfg.reward, policy.cfg.model.name_or_path, policy.dtype)
    try:
        with Progress("data select", progress) as shown:
            shown.stage("scoring candidates", len(candidates), "prompts")
            scores = mean_prompt_scores(
                policy.engine, policy.tokenizer, scorer, policy.encoder, candidates, settings.samples,
                settings.max_new_tokens, policy.cfg.run.seed, shown.advance,
            )  # fmt: skip
    finally:
        scorer.close()
    selected = select_hardest(candidates, scores, settings.fraction)
    selected_ids = {e.id for e in selected}
    merged = merge(base, selected)
    out = write_jsonl(merged, Path(settings.out))
    scored = [s for s in scores if s is not None]
    selected_scores = [s for e, s in zip(candidates, scores, strict=True) if e.id in selected_ids and s is not None]
    return {
        "candidates": len(candidates),
        "unscored": len(candidates) - len(scored),
        "selected": len(selected),
        "base": len(base),
        "written": len(merged),
        "out": str(out),
        "candidate_mean_score": sum(scored) / max(1, len(scored)),
        "selected_mean_score": sum(selected_scores) / max(1, len(selected_scores)),
    }
