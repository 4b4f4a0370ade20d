"""`reasonrl rm train`: a Bradley-Terry scorer or a pairwise generative judge from preference pairs, or a
process reward model from the line labels of `reasonrl prm label`.

Every kind splits its data (seeded), measures held-out accuracy before and after training, saves the
model, and writes ``metrics.jsonl`` and ``summary.json``.  Accuracy of a BT model: the
chosen response scores higher; of a pairwise judge: its position-debiased P(chosen ≻ rejected)
is above ½ (ties count ½ in both, so an untrained model sits at chance).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from reasonrl.data.loaders import DataError, read_records
from reasonrl.data.preferences import conversation_text
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device
from reasonrl.models.value import export_sequence_classifier, value_model_from_policy
from reasonrl.reward.bt import (
    PreferencePair,
    RewardModel,
    load_preference_pairs,
    pair_accuracy,
    split_pairs,
    train_bradley_terry,
)
from reasonrl.reward.pairwise import PairwiseJudge, train_pairwise_judge
from reasonrl.reward.prm import labelled_programs, prm_metrics, train_prm
from reasonrl.timing import Progress


@dataclass(frozen=True)
class RewardModelRun:
    """What ``reasonrl rm train`` runs."""

    kind: Literal["bt", "pairwise", "prm"] = "bt"
    """bt: a scalar Bradley-Terry model (the critic's layout); pairwise: a generative judge (a causal LM);
    prm: a process reward model (the critic's layout) regressed onto the line labels of `prm label`."""

    model: str = "smollm2-135m"
    """The model to start from (a spec as model.name_or_path)."""

    data: str = "hh-rlhf-harmless"
    """Preference pairs: a built-in set or a .jsonl / .jsonl.gz file; kind prm: the labels.jsonl of
    `reasonrl prm label`."""

    out: str = "runs/reward-model"
    """Where the trained model (model/), metrics.jsonl and summary.json go."""

    steps: int = 100
    """Optimiser steps."""

    batch_pairs: int = 8
    """Pairs per optimiser step (a pairwise judge sees each in both orders); kind prm: programs per step."""

    lr: float = 1e-5
    """Learning rate (a BT model's zero-initialised head uses 100×)."""

    held_out: float = 0.2
    """Fraction of the pairs kept out of training for the accuracy measurement; kind prm: of the functions
    under test, with all their programs."""

    eval_pairs: int | None = 200
    """Held-out pairs scored before and after training; None = all of them."""

    max_prompt_tokens: int = 256
    """bt, prm: prompt tokens the model reads (the most recent ones are kept)."""

    max_response_tokens: int = 128
    """bt, prm: response tokens the model reads, EOS included (the first ones are kept; a PRM drops the
    lines beyond); set it to the policy's response cap when the model will score, or initialise the
    critic for, longer answers."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model trains (as model.device): auto = a CUDA GPU when one is visible, else the CPU."""

    seed: int = 0
    """Seed of the split, the shuffling and the initialisation."""


def _judge_accuracy(judge, pairs: list[PreferencePair]) -> float:
    questions = [conversation_text(p.prompt) for p in pairs]
    wins = judge.debiased_reward(questions, [p.chosen for p in pairs], [p.rejected for p in pairs])
    return ((wins > 0.5).float() + 0.5 * (wins == 0.5).float()).mean().item()


def split_groups(programs: list, held_out: float, seed: int) -> tuple[list, list]:
    """(train, held out): a seeded ``held_out`` share of the groups (the functions under test; at least
    one, when there are two) goes to the held-out side with all of its programs."""
    groups = sorted({p.group for p in programs})
    random.Random(seed).shuffle(groups)
    count = min(len(groups) - 1, max(1, round(held_out * len(groups)))) if len(groups) > 1 else 0
    kept_out = set(groups[:count])
    return [p for p in programs if p.group not in kept_out], [p for p in programs if p.group in kept_out]


def run_prm_training(settings: RewardModelRun, out: Path, record, progress: Progress) -> dict:
    """The PRM (kind prm): line-level accuracy, AUC and squared error on held-out prompts' lines, before
    and after regressing the critic's layout onto the labels; the model saved under ``out/model``."""
    tokenizer = load_tokenizer(settings.model)
    rows = read_records(Path(settings.data))
    programs = labelled_programs(rows, tokenizer.eos_token_id, settings.max_prompt_tokens, settings.max_response_tokens)
    if not programs:
        raise DataError(f"{settings.data} holds no labelled lines: give the --out file of `reasonrl prm label`")
    train, held_out = split_groups(programs, settings.held_out, settings.seed)
    dtype = compute_dtype("auto")
    model = value_model_from_policy(settings.model, device=resolve_device(settings.device))
    before = progress.measure("held-out before", len(held_out), "programs", lambda: prm_metrics(model, held_out, dtype))
    progress.stage("training", settings.steps, "steps")
    train_prm(
        model, train, steps=settings.steps, batch_programs=settings.batch_pairs, lr=settings.lr,
        head_lr=100 * settings.lr, compute_dtype=dtype, seed=settings.seed, on_step=record,
    )  # fmt: skip
    after = progress.measure("held-out after", len(held_out), "programs", lambda: prm_metrics(model, held_out, dtype))
    saved = model.save(out / "model")
    tokenizer.save_pretrained(saved)
    export_sequence_classifier(model, tokenizer, out / "hf")
    return {
        "train_programs": len(train),
        "held_out_programs": len(held_out),
        "held_out_before": before,
        "held_out_after": after,
        "held_out_accuracy_before": before["line_accuracy"],
        "held_out_accuracy": after["line_accuracy"],
        "saved": str(saved),
    }


def run_reward_model_training(settings: RewardModelRun, progress: bool | None = False) -> dict:
    """Split, measure held-out accuracy, train, measure again, save; returns (and writes) the summary.
    ``progress``: show the measurements and the steps on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    torch.manual_seed(settings.seed)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    metrics_path.write_text("")

    started = time.perf_counter()
    train_kind = run_prm_training if settings.kind == "prm" else run_preference_training
    with Progress("rm train", progress) as shown:

        def record(metrics: dict) -> None:
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(metrics) + "\n")
            shown.advance(status=f"loss {metrics['loss']:.3f}")

        trained = train_kind(settings, out, record, shown)
    summary = {
        "kind": settings.kind,
        "model": settings.model,
        "data": settings.data,
        **trained,
        "max_prompt_tokens": settings.max_prompt_tokens,
        "max_response_tokens": settings.max_response_tokens,
        "wall_seconds": time.perf_counter() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_preference_training(settings: RewardModelRun, out: Path, record, progress: Progress) -> dict:
    """A Bradley-Terry model (kind bt) or a pairwise judge (kind pairwise): held-out pairwise accuracy
    before and after training on the pairs; the model saved under ``out/model``."""
    device = resolve_device(settings.device)
    train, held_out = split_pairs(load_preference_pairs(settings.data), settings.held_out, settings.seed)
    held_out = held_out[: settings.eval_pairs] if settings.eval_pairs else held_out
    dtype = compute_dtype("auto")
    if settings.kind == "bt":
        rm = RewardModel.from_policy(
            settings.model,
            compute_dtype=dtype,
            device=device,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_response_tokens=settings.max_response_tokens,
        )
        before = progress.measure("held-out before", len(held_out), "pairs", lambda: pair_accuracy(rm, held_out))
        progress.stage("training", settings.steps, "steps")
        train_bradley_terry(
            rm, train, steps=settings.steps, batch_pairs=settings.batch_pairs, lr=settings.lr,
            head_lr=100 * settings.lr, seed=settings.seed, on_step=record,
        )  # fmt: skip
        after = progress.measure("held-out after", len(held_out), "pairs", lambda: pair_accuracy(rm, held_out))
        saved = rm.save(out / "model")
        rm.export(out / "hf")
    else:
        tokenizer = load_tokenizer(settings.model)
        judge = PairwiseJudge(load_model(settings.model, torch.float32, device=device), tokenizer, compute_dtype=dtype)
        before = progress.measure("held-out before", len(held_out), "pairs", lambda: _judge_accuracy(judge, held_out))
        triples = [(conversation_text(p.prompt), p.chosen, p.rejected) for p in train]
        progress.stage("training", settings.steps, "steps")
        train_pairwise_judge(
            judge, triples, steps=settings.steps, batch_pairs=settings.batch_pairs, lr=settings.lr,
            seed=settings.seed, on_step=record,
        )  # fmt: skip
        after = progress.measure("held-out after", len(held_out), "pairs", lambda: _judge_accuracy(judge, held_out))
        saved = out / "model"
        judge.model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
    return {
        "train_pairs_seen": settings.steps * settings.batch_pairs,
        "train_pairs_available": len(train),
        "held_out_pairs": len(held_out),
        "held_out_accuracy_before": before,
        "held_out_accuracy": after,
        "saved": str(saved),
    }
