"""Pre-PPO prompt selection (Data-Scaling RLHF, arXiv 2503.22230 §4).

Sample responses to every candidate prompt with the initial policy, score them with the reward
(the router: verifiers, GenRM or the Bradley-Terry model), z-normalise the mean score per prompt
within its domain (task type: score scales differ by domain), keep the lowest-scoring p% — the
hardest, least hackable prompts — and merge them into the base set.  `reasonrl data select`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.algo.preference import domain_zscores
from reasonrl.data.examples import Example
from reasonrl.timing import Progress

if TYPE_CHECKING:
    from reasonrl.config import Config


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


def write_jsonl(examples: Sequence[Example], path: Path) -> Path:
    """One row per example with question, answer, task_type and id, and a ``verifier_answer`` column where the
    example has one (loadable as a dataset)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for e in examples:
            row = {"id": e.id, "question": e.question, "answer": e.answer, "task_type": e.task_type}
            if e.fields.get("verifier_answer") is not None:
                row["verifier_answer"] = e.fields["verifier_answer"]
            handle.write(json.dumps(row) + "\n")
    return path


SCORING_CHUNK = 32  # prompts sampled and scored per call (the progress bar advances by this much)


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
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.scored import sample_and_score

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


@dataclass
class InitialPolicy:
    """What the data commands sample with: a config, its compute dtype, tokenizer, engine and prompt encoder."""

    cfg: Config
    dtype: torch.dtype
    tokenizer: Any
    engine: Any
    encoder: Any

    @classmethod
    def load(cls, cfg: Config, template: str | None = None) -> InitialPolicy:
        """The initial policy of ``cfg`` (model.name_or_path, rollout.*, ...); ``template`` overrides
        the config's prompt template."""
        from reasonrl.config.plan import vllm_engine_options
        from reasonrl.data.prompts import PromptEncoder
        from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device, vision_processor
        from reasonrl.rollout import build_engine

        dtype = compute_dtype(cfg.model.dtype)
        tokenizer = load_tokenizer(cfg.model.name_or_path)
        model = load_model(cfg.model.name_or_path, device=resolve_device(cfg.model.device))
        engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
        encoder = PromptEncoder(
            tokenizer,
            template or cfg.data.prompt_template,
            cfg.rollout.max_prompt_tokens,
            processor=vision_processor(cfg.model.name_or_path),
        )
        return cls(cfg, dtype, tokenizer, engine, encoder)


def prompt_rows(cfg: Config, source: str, split: str = "auto", limit: int | None = None) -> list[Example]:
    """The first ``limit`` rows of one split of a dataset name or file, with the config's field names;
    split ``auto``: the train split where there is one, else the dataset's only split."""
    from reasonrl.data.loaders import DataError, Fields, default_split, load_examples

    split = default_split(source) if split == "auto" else split
    rows = load_examples(source, split, Fields(cfg.data.question_field, cfg.data.answer_field))
    rows = rows if limit is None else rows[:limit]
    shown = next((e for e in rows if e.images), None)
    if shown is not None:  # the files they write hold text and token ids, not images
        raise DataError(
            f"{source} has prompts with images ({shown.id}); the data commands (select, bon, sample, prm label) "
            "write text prompts only so far: train or evaluate on the visual set directly"
        )
    return rows


def run_selection(
    candidates_source: str,
    base_source: str | None,
    out: Path,
    *,
    fraction: float = 0.1,
    samples: int = 4,
    max_new_tokens: int = 64,
    overrides: Sequence[str] = (),
    split: str = "auto",
    limit: int | None = None,
    progress: bool | None = False,
) -> dict:
    """Score the first ``limit`` rows of ``candidates_source`` with the initial policy and the run's reward
    router, keep the hardest ``fraction``, merge into ``base_source`` and write ``out``; returns a summary.
    ``split`` picks the split of both sources (auto: train where a dataset has one, else its only split);
    ``progress``: show the scoring on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    from reasonrl.config import load_config
    from reasonrl.reward.router import build_router

    cfg = load_config(None, list(overrides))
    candidates = prompt_rows(cfg, candidates_source, split, limit)
    base = prompt_rows(cfg, base_source, split) if base_source else []
    policy = InitialPolicy.load(cfg)
    scorer = build_router(policy.cfg, policy.dtype)
    try:
        with Progress("data select", progress) as shown:
            shown.stage("scoring candidates", len(candidates), "prompts")
            scores = mean_prompt_scores(
                policy.engine, policy.tokenizer, scorer, policy.encoder, candidates, samples, max_new_tokens,
                policy.cfg.run.seed, shown.advance,
            )  # fmt: skip
    finally:
        scorer.close()
    selected = select_hardest(candidates, scores, fraction)
    selected_ids = {e.id for e in selected}
    merged = merge(base, selected)
    write_jsonl(merged, out)
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


def best_of_n_references(
    prompts_source: str,
    reward_model: str,
    out: Path,
    *,
    n: int = 4,
    max_new_tokens: int = 128,
    overrides=(),
    progress: bool | None = False,
) -> dict:
    """For every prompt, sample ``n`` responses from the initial policy and keep the one the Bradley-Terry
    model scores highest as its reference: rows with task_type ``open`` (GenRM vs best-of-N, Data-Scaling RLHF §3);
    a math prompt's true answer goes to the row's ``verifier_answer`` (``reward/verifier_accuracy`` measures the
    judge against it).  The prompts go SCORING_CHUNK at a time, each keeping its sampling stream in the whole
    call (``share_params``), so the fast and vLLM engines sample what one call would; ``progress`` as in
    ``run_selection``."""
    from reasonrl.config import load_config
    from reasonrl.models.value import is_sequence_classifier, value_model_dir
    from reasonrl.reward.bt import RewardModel
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.base import share_params

    cfg = load_config(None, list(overrides))
    if not is_sequence_classifier(reward_model):  # a bad path fails before any sampling
        reward_model = str(value_model_dir(reward_model))
    examples = prompt_rows(cfg, prompts_source)
    policy = InitialPolicy.load(cfg, template="plain")
    kept = [e for e in examples if policy.encoder(e) is not None]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=policy.cfg.run.seed)
    rm = RewardModel.load(reward_model, compute_dtype=policy.dtype)
    texts: list[str] = []
    scores: list[float] = []
    with Progress("data bon", progress) as shown:
        shown.stage("sampling and scoring", len(kept), "prompts")
        for start in range(0, len(kept), SCORING_CHUNK):
            chunk = [e for e in kept[start : start + SCORING_CHUNK] for _ in range(n)]
            chunk_params = share_params(params, len(texts), len(texts) + len(chunk))
            completions = policy.engine.generate([policy.encoder(e) for e in chunk], chunk_params)
            replies = policy.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
            scores += rm.score([[{"role": "user", "content": e.question}] for e in chunk], replies)
            texts += replies
            shown.advance(len(chunk) // n, tokens=sum(len(c.token_ids) for c in completions))
    rows = []
    for i, example in enumerate(kept):
        best = max(range(i * n, (i + 1) * n), key=lambda j: scores[j])
        # a verifiable prompt keeps its true answer beside the reference, to measure reward hacking against
        truth = example.answer if example.task_type == "math" else example.fields.get("verifier_answer")
        fields = {"verifier_answer": truth} if truth is not None else {}
        rows.append(Example(example.id, example.question, texts[best].strip(), "open", fields=fields))
    write_jsonl(rows, out)
    return {"prompts": len(examples), "written": len(rows), "n": n, "out": str(out)}
