"""Pre-PPO prompt selection (Data-Scaling RLHF, arXiv 2503.22230; spec §7 (b)3).

Sample responses to every candidate prompt with the initial policy, score them with the reward
(the router: verifiers, GenRM or the Bradley-Terry model), z-normalise the mean score per prompt
within its domain (task type: score scales differ by domain), keep the lowest-scoring p% — the
hardest, least hackable prompts — and merge them into the base set.  `reasonrl data select`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.algo.preference import domain_zscores
from reasonrl.data.examples import Example

if TYPE_CHECKING:
    from reasonrl.config import Config


def select_hardest(candidates: Sequence[Example], scores: Sequence[float], fraction: float) -> list[Example]:
    """The ``fraction`` of candidates with the lowest within-domain z-score (ties: first in order).

    Invariant to any per-domain affine rescaling a·s + b (a > 0) of the scores.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"the kept fraction must be in (0, 1], got {fraction}")
    z = domain_zscores(torch.tensor(list(scores), dtype=torch.float64), [e.task_type for e in candidates])
    keep = math.ceil(fraction * len(candidates))
    order = sorted(range(len(candidates)), key=lambda i: (z[i].item(), i))
    return [candidates[i] for i in sorted(order[:keep])]


def merge(base: Sequence[Example], selected: Sequence[Example]) -> list[Example]:
    """The base set followed by the selected prompts it does not already hold (by question text)."""
    seen = {e.question for e in base}
    return [*base, *(e for e in selected if e.question not in seen)]


def write_jsonl(examples: Sequence[Example], path: Path) -> Path:
    """One row per example with question, answer, task_type and id (loadable as a dataset)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for e in examples:
            handle.write(json.dumps({"id": e.id, "question": e.question, "answer": e.answer, "task_type": e.task_type}))
            handle.write("\n")
    return path


def mean_prompt_scores(
    engine, tokenizer, scorer, encoder, examples: Sequence[Example], samples: int, max_new_tokens: int, seed: int
) -> list[float]:
    """Mean reward of ``samples`` sampled responses per prompt under the current (initial) policy."""
    from reasonrl.rollout import SamplingParams
    from reasonrl.train.rollout import sample_and_score

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    scored = sample_and_score(engine, tokenizer, scorer, encoder, examples, params, samples)
    totals: dict[str, list[float]] = {}
    for example, result in zip(scored.examples, scored.results, strict=True):
        totals.setdefault(example.id, []).append(result.score)
    return [sum(totals[e.id]) / len(totals[e.id]) if e.id in totals else math.inf for e in examples]


@dataclass
class InitialPolicy:
    """What the data commands sample with: a config, its compute dtype, tokenizer, engine and prompt encoder."""

    cfg: Config
    dtype: torch.dtype
    tokenizer: Any
    engine: Any
    encoder: Any

    @classmethod
    def load(cls, overrides: Sequence[str], template: str | None = None) -> InitialPolicy:
        """The initial policy of ``overrides`` (model.name_or_path, rollout.*, ...); ``template`` overrides
        the config's prompt template."""
        from reasonrl.config import load_config
        from reasonrl.config.plan import vllm_engine_options
        from reasonrl.models.load import compute_dtype, load_model, load_tokenizer
        from reasonrl.rollout import build_engine
        from reasonrl.train.rollout import PromptEncoder

        cfg = load_config(None, list(overrides))
        dtype = compute_dtype(cfg.model.dtype)
        tokenizer = load_tokenizer(cfg.model.name_or_path)
        model = load_model(cfg.model.name_or_path)
        engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
        encoder = PromptEncoder(tokenizer, template or cfg.data.prompt_template, cfg.rollout.max_prompt_tokens)
        return cls(cfg, dtype, tokenizer, engine, encoder)

    def examples(self, source: str) -> list[Example]:
        """All rows of a dataset name or file, with the config's field names."""
        from reasonrl.data.loaders import Fields, load_examples

        return load_examples(source, "train", Fields(self.cfg.data.question_field, self.cfg.data.answer_field))


def run_selection(
    candidates_source: str,
    base_source: str | None,
    out: Path,
    *,
    fraction: float = 0.1,
    samples: int = 4,
    max_new_tokens: int = 64,
    overrides: Sequence[str] = (),
) -> dict:
    """Score ``candidates_source`` with the initial policy and the run's reward router, keep the hardest
    ``fraction``, merge into ``base_source`` and write ``out``; returns a summary."""
    from reasonrl.train.loop import build_router

    policy = InitialPolicy.load(overrides)
    candidates = policy.examples(candidates_source)
    base = policy.examples(base_source) if base_source else []
    scorer = build_router(policy.cfg, policy.dtype)
    try:
        scores = mean_prompt_scores(
            policy.engine, policy.tokenizer, scorer, policy.encoder, candidates, samples, max_new_tokens,
            policy.cfg.run.seed,
        )  # fmt: skip
    finally:
        scorer.close()
    selected = select_hardest(candidates, scores, fraction)
    selected_ids = {e.id for e in selected}
    merged = merge(base, selected)
    write_jsonl(merged, out)
    finite = [s for s in scores if math.isfinite(s)]
    selected_scores = [s for e, s in zip(candidates, scores, strict=True) if e.id in selected_ids]
    return {
        "candidates": len(candidates),
        "selected": len(selected),
        "base": len(base),
        "written": len(merged),
        "out": str(out),
        "candidate_mean_score": sum(finite) / max(1, len(finite)),
        "selected_mean_score": sum(selected_scores) / max(1, len(selected_scores)),
    }


def best_of_n_references(
    prompts_source: str, reward_model: str, out: Path, *, n: int = 4, max_new_tokens: int = 128, overrides=()
) -> dict:
    """For every prompt, sample ``n`` responses from the initial policy and keep the one the Bradley-Terry
    model scores highest as its reference: rows with task_type ``open`` (GenRM vs best-of-N, spec §7 (b)1)."""
    from reasonrl.reward.bt import RewardModel
    from reasonrl.rollout import SamplingParams

    policy = InitialPolicy.load(overrides, template="plain")
    examples = policy.examples(prompts_source)
    kept = [e for e in examples if policy.encoder(e) is not None]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=policy.cfg.run.seed)
    completions = policy.engine.generate([policy.encoder(e) for e in kept for _ in range(n)], params)
    texts = policy.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    rm = RewardModel.load(reward_model, compute_dtype=policy.dtype)
    scores = rm.score([[{"role": "user", "content": e.question}] for e in kept for _ in range(n)], texts)
    rows = []
    for i, example in enumerate(kept):
        best = max(range(i * n, (i + 1) * n), key=lambda j: scores[j])
        rows.append(Example(example.id, example.question, texts[best].strip(), "open"))
    write_jsonl(rows, out)
    return {"prompts": len(examples), "written": len(rows), "n": n, "out": str(out)}
