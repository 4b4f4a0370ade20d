"""`reasonrl rm train`: a Bradley-Terry scorer or a pairwise generative judge from preference pairs.

Both kinds split the pairs (seeded), measure held-out pairwise accuracy before and after training,
save the model, and write ``metrics.jsonl`` and ``summary.json``.  Accuracy of a BT model: the
chosen response scores higher; of a pairwise judge: its position-debiased P(chosen ≻ rejected)
is above ½ (ties count ½ in both, so an untrained model sits at chance).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from reasonrl.config.commands import RewardModelRun
from reasonrl.data.preferences import conversation_text
from reasonrl.reward.bt import (
    PreferencePair,
    RewardModel,
    load_preference_pairs,
    pair_accuracy,
    split_pairs,
    train_bradley_terry,
)


def _judge_accuracy(judge, pairs: list[PreferencePair]) -> float:
    questions = [conversation_text(p.prompt) for p in pairs]
    wins = judge.debiased_reward(questions, [p.chosen for p in pairs], [p.rejected for p in pairs])
    return ((wins > 0.5).float() + 0.5 * (wins == 0.5).float()).mean().item()


def run_reward_model_training(settings: RewardModelRun) -> dict:
    """Split, measure held-out accuracy, train, measure again, save; returns (and writes) the summary."""
    from reasonrl.models.load import compute_dtype

    torch.manual_seed(settings.seed)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = split_pairs(load_preference_pairs(settings.data), settings.held_out, settings.seed)
    held_out = held_out[: settings.eval_pairs] if settings.eval_pairs else held_out
    metrics_path = out / "metrics.jsonl"
    metrics_path.write_text("")
    started = time.perf_counter()
    dtype = compute_dtype("auto")
    if settings.kind == "bt":
        rm = RewardModel.from_policy(
            settings.model,
            compute_dtype=dtype,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_response_tokens=settings.max_response_tokens,
        )
        before = pair_accuracy(rm, held_out)

        def record(metrics: dict) -> None:
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(metrics) + "\n")

        train_bradley_terry(
            rm, train, steps=settings.steps, batch_pairs=settings.batch_pairs, lr=settings.lr,
            head_lr=100 * settings.lr, seed=settings.seed, on_step=record,
        )  # fmt: skip
        after = pair_accuracy(rm, held_out)
        saved = rm.save(out / "model")
    else:
        from reasonrl.models.load import load_model, load_tokenizer
        from reasonrl.reward.pairwise import PairwiseJudge, train_pairwise_judge

        tokenizer = load_tokenizer(settings.model)
        judge = PairwiseJudge(load_model(settings.model, torch.float32), tokenizer, compute_dtype=dtype)
        before = _judge_accuracy(judge, held_out)
        triples = [(conversation_text(p.prompt), p.chosen, p.rejected) for p in train]
        losses = train_pairwise_judge(
            judge, triples, steps=settings.steps, batch_pairs=settings.batch_pairs, lr=settings.lr, seed=settings.seed
        )
        metrics_path.write_text("".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate(losses)))
        after = _judge_accuracy(judge, held_out)
        saved = out / "model"
        judge.model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
    summary = {
        "kind": settings.kind,
        "model": settings.model,
        "data": settings.data,
        "train_pairs_seen": settings.steps * settings.batch_pairs,
        "train_pairs_available": len(train),
        "held_out_pairs": len(held_out),
        "held_out_accuracy_before": before,
        "held_out_accuracy": after,
        "max_prompt_tokens": settings.max_prompt_tokens,
        "max_response_tokens": settings.max_response_tokens,
        "wall_seconds": time.perf_counter() - started,
        "saved": str(saved),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
