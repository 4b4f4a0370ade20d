"""`reasonrl rm pretrain --contrastive`: COCA's contrastive pretraining (arXiv 2108.10510) of the encoder a
reward model or a critic starts from.

For a reward model the "behaviour sequence" COCA encodes is the conversation before the reply it
scores.  Each step takes N conversations (a preference pair's prompt with its chosen reply), makes two
views of each history with two different augmentations (``reasonrl.data.augment``: term masking, turn
deletion, exchange reordering; the reply is never changed), reads each view's representation at the end
of its history (the state before the reply), and minimises InfoNCE with the other 2N − 2 views as
negatives (``reasonrl.algo.contrastive_losses.info_nce``).  The encoder is saved as a causal LM with a zero
value head, so `rm train --model OUT/model` (bt, pairwise) and critics
(`critic.init=reward_model critic.path=OUT`) start from it.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file

from reasonrl.algo.contrastive_losses import info_nce
from reasonrl.batch import pad_rows
from reasonrl.config import ConfigError
from reasonrl.data.augment import two_views
from reasonrl.data.loaders import DataError
from reasonrl.models.forward import response_hidden_states
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device
from reasonrl.models.optim import apply_gradients
from reasonrl.models.value import HEAD_FILE, ValueModel
from reasonrl.reward.bt import PreferencePair, RewardModel, load_preference_pairs, split_pairs
from reasonrl.timing import Progress

AUGMENTATIONS = ("mask", "delete", "reorder")
"""COCA's augmentations of a conversation history (``reasonrl.data.augment``)."""


@dataclass(frozen=True)
class ContrastivePretrainRun:
    """What ``reasonrl rm pretrain --contrastive`` runs: COCA's contrastive pretraining (arXiv 2108.10510)
    of the encoder a reward model or a critic starts from."""

    model: str = "smollm2-135m"
    """The model to start from (a spec as model.name_or_path)."""

    data: str = "hh-rlhf-harmless"
    """Conversations: the prompts and chosen replies of preference pairs (a built-in set or a .jsonl file)."""

    out: str = "runs/contrastive-encoder"
    """Where the pretrained encoder (model/), metrics.jsonl and summary.json go; `rm train --model OUT/model`
    and `critic.init=reward_model critic.path=OUT` start from it."""

    steps: int = 100
    """Optimiser steps."""

    batch_pairs: int = 8
    """Conversations per optimiser step (each gives two views: 2N − 2 negatives per anchor)."""

    lr: float = 1e-5
    """Learning rate (COCA: 5e-5 for BERT-base)."""

    temperature: float = 0.1
    """τ of the InfoNCE loss (COCA's 0.1)."""

    augmentations: str = "mask,delete,reorder"
    """The augmentations a view may use, comma-separated: mask (terms), delete (turns), reorder (exchanges);
    COCA's ablation drops one at a time."""

    mask_rate: float = 0.5
    """Share of each history turn's words masked (COCA's term-deletion rate)."""

    delete_rate: float = 0.5
    """Share of the history's turns deleted (COCA's query/document deletion rate)."""

    held_out: float = 0.2
    """Fraction of the conversations kept out of training for the held-out loss and accuracy."""

    eval_pairs: int | None = 200
    """Held-out conversations scored before and after; None = all of them."""

    max_prompt_tokens: int = 256
    """History tokens the encoder reads (the most recent ones are kept)."""

    max_response_tokens: int = 128
    """Reply tokens the encoder reads (the first ones are kept)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model trains (as model.device): auto = a CUDA GPU when one is visible, else the CPU."""

    seed: int = 0
    """Seed of the split, the views and the shuffling."""

    def check(self) -> None:
        """Refuse settings that cannot train (ConfigError naming each problem)."""
        names = [n.strip() for n in self.augmentations.split(",") if n.strip()]
        checks = [
            (bool(names) and set(names) <= set(AUGMENTATIONS),
             f"--augmentations must name some of {', '.join(AUGMENTATIONS)}, got {self.augmentations!r}"),
            (names != ["reorder"], "--augmentations reorder needs another one beside it: most histories have fewer "
                                   "than two exchanges to swap"),
            (self.temperature > 0, f"--temperature must be > 0, got {self.temperature}"),
            (0 <= self.mask_rate <= 1 and 0 <= self.delete_rate <= 1,
             "--mask-rate and --delete-rate must be in [0, 1]"),
            (self.batch_pairs >= 2,
             f"--batch-pairs must be >= 2 (the other conversations are the negatives), got {self.batch_pairs}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


def representations(rm: RewardModel, histories: Sequence, replies: Sequence[str]) -> torch.Tensor:
    """[N, d]: the backbone's state at the end of each history, before its reply: COCA encodes the behaviour
    sequence itself (read after the reply, the unchanged reply alone would tell the conversations apart)."""
    encoded = [rm.encode(h, r) for h, r in zip(histories, replies, strict=True)]
    # the state before the first reply token depends on the history alone (causal attention): one token suffices
    prompts, responses = [p for p, _ in encoded], [r[:1] for _, r in encoded]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    hidden = response_hidden_states(
        rm.model.backbone,
        pad_rows(prompts, p_width, True, torch.long),
        pad_rows([[1] * len(p) for p in prompts], p_width, True, torch.bool),
        pad_rows(responses, r_width, False, torch.long),
        pad_rows([[1] * len(r) for r in responses], r_width, False, torch.bool),
        rm.compute_dtype,
    )  # [N, T, d]
    return hidden[:, 0].float()  # the state before the first reply token: after the whole history


def contrastive_loss(rm: RewardModel, pairs: Sequence[PreferencePair], settings: ContrastivePretrainRun, rng):
    """InfoNCE of two augmented views of each conversation's history: (loss, accuracy)."""
    enabled = [n.strip() for n in settings.augmentations.split(",") if n.strip()]
    views = [two_views(p.prompt, enabled, rng, settings.mask_rate, settings.delete_rate) for p in pairs]
    replies = [p.chosen for p in pairs]
    first = representations(rm, [a for a, _ in views], replies)
    second = representations(rm, [b for _, b in views], replies)
    return info_nce(first, second, settings.temperature)


def held_out_metrics(rm: RewardModel, pairs: Sequence[PreferencePair], settings: ContrastivePretrainRun) -> dict:
    """Held-out InfoNCE loss and top-1 accuracy (positive found among 2N − 1 views), fixed views, in batches."""
    rng, losses, accuracies = random.Random(f"held-out:{settings.seed}"), [], []
    rm.model.eval()
    with torch.no_grad():
        for start in range(0, len(pairs) - 1, settings.batch_pairs):
            chunk = pairs[start : start + settings.batch_pairs]
            if len(chunk) >= 2:
                loss, accuracy = contrastive_loss(rm, chunk, settings, rng)
                losses.append(loss.item())
                accuracies.append(accuracy.item())
    return {"loss": sum(losses) / max(1, len(losses)), "accuracy": sum(accuracies) / max(1, len(accuracies))}


def train_encoder(
    rm: RewardModel, train: Sequence[PreferencePair], settings: ContrastivePretrainRun, path: Path, progress: Progress
) -> None:
    """``settings.steps`` InfoNCE steps on seeded batches of ``train``, each step's loss, accuracy and gradient
    norm a line of ``path`` (metrics.jsonl)."""
    optimizer = torch.optim.AdamW(rm.model.backbone.parameters(), lr=settings.lr, weight_decay=0.0)
    rng, order = random.Random(settings.seed), []
    with path.open("w") as metrics:
        for step in range(1, settings.steps + 1):
            if len(order) < settings.batch_pairs:  # a new seeded shuffle (the last one's leftovers dropped:
                order = rng.sample(range(len(train)), len(train))  # no conversation twice in a batch)
            batch, order = [train[i] for i in order[: settings.batch_pairs]], order[settings.batch_pairs :]
            rm.model.train()
            loss, accuracy = contrastive_loss(rm, batch, settings, rng)
            loss.backward()
            grad_norm = apply_gradients(rm.model, optimizer, 5.0)  # COCA clips at 5
            record = {"step": step, "loss": loss.item(), "train_accuracy": accuracy.item(), "grad_norm": grad_norm}
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            progress.advance(status=f"loss {record['loss']:.3f}  acc {record['train_accuracy']:.2f}")


def run_contrastive_pretraining(settings: ContrastivePretrainRun, progress: bool | None = False) -> dict:
    """Split, measure, train, measure again, save; returns (and writes) the summary.  ``progress``: show the
    measurements and the steps on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    settings.check()
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = split_pairs(load_preference_pairs(settings.data), settings.held_out, settings.seed)
    held_out = held_out[: settings.eval_pairs] if settings.eval_pairs else held_out
    if len(train) < settings.batch_pairs or len(held_out) < 2:
        raise DataError(
            f"{settings.data}: {len(train)} training and {len(held_out)} held-out conversations; contrastive "
            f"pretraining needs at least --batch-pairs ({settings.batch_pairs}) and 2"
        )
    device = resolve_device(settings.device)
    causal_lm = load_model(settings.model, torch.float32, device=device)  # its backbone trained in place, LM head kept
    tokenizer = load_tokenizer(settings.model)
    rm = RewardModel(
        ValueModel(causal_lm.base_model).to(device), tokenizer, compute_dtype=compute_dtype("auto"),
        max_prompt_tokens=settings.max_prompt_tokens, max_response_tokens=settings.max_response_tokens,
    )  # fmt: skip
    measure = functools.partial(held_out_metrics, rm, held_out, settings)
    with Progress("rm pretrain", progress) as shown:
        before = shown.measure("held-out before", len(held_out), "conversations", measure)
        shown.stage("training", settings.steps, "steps")
        train_encoder(rm, train, settings, out / "metrics.jsonl", shown)
        after = shown.measure("held-out after", len(held_out), "conversations", measure)
    saved = out / "model"
    causal_lm.save_pretrained(saved)  # the whole causal LM, its LM head included (untied models too)
    tokenizer.save_pretrained(saved)
    zero_head = ValueModel(causal_lm.base_model).head  # beside it a zero value head: critic.init=reward_model
    save_file({"weight": zero_head.weight.detach().contiguous(), "bias": zero_head.bias.detach()}, saved / HEAD_FILE)
    summary = {
        "method": "contrastive (COCA)",
        "model": settings.model,
        "data": settings.data,
        "augmentations": settings.augmentations,
        "train_conversations": len(train),
        "held_out_conversations": len(held_out),
        "held_out_before": before,
        "held_out_after": after,
        "saved": str(saved),
        "head_file": HEAD_FILE,
        "wall_seconds": time.perf_counter() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
