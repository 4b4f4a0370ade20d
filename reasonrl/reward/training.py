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
from pathlib import Path

import torch

from reasonrl.config.commands import RewardModelRun
from reasonrl.data.loaders import DataError
from reasonrl.data.preferences import conversation_text
from reasonrl.reward.bt import (
    PreferencePair,
    RewardModel,
    load_preference_pairs,
    pair_accuracy,
    split_pairs,
    train_bradley_terry,
)
from reasonrl.timing import Progress


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
    from reasonrl.data.loaders import read_records
    from reasonrl.models.load import compute_dtype, load_tokenizer, resolve_device
    from reasonrl.models.value import export_sequence_classifier, value_model_from_policy
    from reasonrl.reward.prm import labelled_programs, prm_metrics, train_prm

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
    from reasonrl.models.load import compute_dtype, resolve_device

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
        from reasonrl.models.load import load_model, load_tokenizer
        from reasonrl.reward.pairwise import PairwiseJudge, train_pairwise_judge

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
