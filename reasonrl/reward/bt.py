"""Bradley-Terry reward model: preference pairs in, a scalar scorer out (`reasonrl rm train`).

The model is a ``ValueModel`` (causal-LM backbone + scalar head); the score of a response is the
head's output at its last token.  Saved in the ``ValueModel`` layout plus the tokenizer, so a
critic can start from it (``critic.init=reward_model``, VAPO §5.1) and the hybrid router can load
it as a scorer.  Preference data: HH-RLHF transcripts (``chosen`` / ``rejected``, shared prefix)
or any jsonl with ``prompt`` / ``chosen`` / ``rejected`` fields.
"""

from __future__ import annotations

import gzip
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from reasonrl.algo.preference import bradley_terry_loss, pairwise_accuracy
from reasonrl.batch import pad_rows
from reasonrl.data.loaders import DataError, chat_messages, json_object
from reasonrl.data.preferences import parse_transcript
from reasonrl.data.prompts import chat_token_ids, text_token_ids
from reasonrl.models.optim import apply_gradients
from reasonrl.models.value import (
    HEAD_FILE,
    ValueModel,
    export_sequence_classifier,
    exported_by_reasonrl,
    is_sequence_classifier,
    load_value_model,
    value_model_dir,
    value_model_from_policy,
)

log = logging.getLogger(__name__)
Messages = list[dict[str, str]]
BUILTIN_PREFERENCES = {"hh-rlhf-harmless": "hh-rlhf-harmless-test.jsonl.gz"}


@dataclass(frozen=True)
class PreferencePair:
    """A conversation and two candidate final assistant turns, the first preferred."""

    prompt: Messages
    chosen: str
    rejected: str


def _pair_from_row(row: dict, where: str) -> PreferencePair:
    if "prompt" in row:
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return PreferencePair(list(chat_messages(where, "prompt", messages)), str(row["chosen"]), str(row["rejected"]))
    chosen, rejected = parse_transcript(row["chosen"]), parse_transcript(row["rejected"])
    if not chosen or chosen[-1]["role"] != "assistant" or not rejected or rejected[-1]["role"] != "assistant":
        raise DataError(f"{where}: a transcript does not end with an Assistant turn")
    return PreferencePair(chosen[:-1], chosen[-1]["content"], rejected[-1]["content"])


def load_preference_pairs(source: str) -> list[PreferencePair]:
    """Pairs from a built-in set (``hh-rlhf-harmless``) or a .jsonl / .jsonl.gz file; malformed rows are errors."""
    if source in BUILTIN_PREFERENCES:
        path = Path(str(resources.files("reasonrl.data") / "builtin" / BUILTIN_PREFERENCES[source]))
    else:
        path = Path(source)
        if not path.exists():
            raise DataError(f"preference data '{source}' is neither a file nor one of {', '.join(BUILTIN_PREFERENCES)}")
    opener = gzip.open if path.suffix == ".gz" else open
    pairs = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                pairs.append(_pair_from_row(json_object(line, where), where))
            except (KeyError, TypeError) as exc:
                raise DataError(f"{where}: not a preference pair ({exc!r}); need chosen/rejected [+ prompt]") from exc
    return pairs


def split_pairs(pairs: Sequence[PreferencePair], held_out: float, seed: int) -> tuple[list, list]:
    """A seeded shuffle split into (train, held-out)."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    cut = len(order) - max(1, round(held_out * len(order)))
    return [pairs[i] for i in order[:cut]], [pairs[i] for i in order[cut:]]


class RewardModel:
    """A scalar scorer: ``score(prompts, responses)`` -> one float per response."""

    def __init__(
        self,
        model: ValueModel,
        tokenizer,
        *,
        max_prompt_tokens: int = 256,
        max_response_tokens: int = 128,
        compute_dtype: torch.dtype = torch.float32,
        conversation_end: bool = False,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_prompt_tokens, self.max_response_tokens = max_prompt_tokens, max_response_tokens
        self.compute_dtype = compute_dtype
        # True: score at the last token of the chat-formatted conversation, the reply's end-of-turn tokens
        # included (how Hugging Face reward models are trained and read); False: after the reply's text (ours)
        self.conversation_end = conversation_end

    def encode(self, prompt: Messages, response: str) -> tuple[list[int], list[int]]:
        """(prompt ids, keeping the most recent tokens; response ids, keeping the first tokens, + EOS).  The
        score is read at the EOS slot: the state after the reply's text, or with ``conversation_end`` after
        the chat template's end of the reply.  The texts are others': a control token they spell stays text."""
        prompt_ids = chat_token_ids(self.tokenizer, prompt)
        response_ids = text_token_ids(self.tokenizer, response)
        if self.conversation_end and self.tokenizer.chat_template:
            reply = {"role": "assistant", "content": response}
            ids = chat_token_ids(self.tokenizer, [*prompt, reply], generation_prompt=False)
            pad = getattr(self.model.backbone.config, "pad_token_id", None)
            while ids and ids[-1] == pad:  # Hugging Face reads the last token that is not padding
                ids.pop()
            if ids[: len(prompt_ids)] == prompt_ids:  # the template renders the prompt the same either way
                response_ids = ids[len(prompt_ids) :]
            else:
                log.warning("the chat template renders the prompt differently with a reply; scoring after the reply")
        response_ids = response_ids[: self.max_response_tokens - 1]
        return prompt_ids[-self.max_prompt_tokens :], [*response_ids, self.tokenizer.eos_token_id]

    def forward_scores(self, encoded: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Scores [N] of encoded (prompt, response) rows, differentiable when grad mode is on."""
        prompts, responses = [p for p, _ in encoded], [r for _, r in encoded]
        p_width, r_width = max(map(len, prompts)), max(map(len, responses))
        values = self.model(
            pad_rows(prompts, p_width, True, torch.long),
            pad_rows([[1] * len(p) for p in prompts], p_width, True, torch.bool),
            pad_rows(responses, r_width, False, torch.long),
            pad_rows([[1] * len(r) for r in responses], r_width, False, torch.bool),
            self.compute_dtype,
        )  # [N, T]
        last = torch.tensor([len(r) - 1 for r in responses], device=values.device)  # [N] the EOS position
        return values.gather(1, last[:, None]).squeeze(1)

    def score(self, prompts: Sequence[Messages], responses: Sequence[str], batch_size: int = 8) -> list[float]:
        """One score per (prompt, response), computed in batches without gradients."""
        out: list[float] = []
        self.model.eval()
        with torch.no_grad():
            for start in range(0, len(responses), batch_size):
                chunk = zip(prompts[start : start + batch_size], responses[start : start + batch_size], strict=True)
                out += self.forward_scores([self.encode(p, r) for p, r in chunk]).tolist()
        return out

    def save(self, directory: Path) -> Path:
        """The ValueModel layout plus the tokenizer."""
        self.model.save(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def export(self, directory: Path) -> Path:
        """The Hugging Face reward-model format (``AutoModelForSequenceClassification``, one label)."""
        return export_sequence_classifier(self.model, self.tokenizer, directory)

    @classmethod
    def load(cls, source: str | Path, **options) -> RewardModel:
        """A reward model written by ``save`` (or the output directory of `reasonrl rm train`), or a Hugging
        Face sequence-classification reward model (a directory or a hub id), read at the conversation's end."""
        from transformers import AutoTokenizer

        device = options.pop("device", "cpu")
        model = load_value_model(source).to(device)
        native = not is_sequence_classifier(source) and any(
            (Path(source) / part / HEAD_FILE).exists() for part in ("", "model")
        )
        where = value_model_dir(source) if native else source
        ours = native or exported_by_reasonrl(source)  # read where it was trained to be read
        return cls(model, AutoTokenizer.from_pretrained(str(where)), conversation_end=not ours, **options)

    @classmethod
    def from_policy(cls, spec: str, **options) -> RewardModel:
        """An untrained reward model on a policy's backbone (zero head), on ``device`` (default the CPU)."""
        from reasonrl.models.load import load_tokenizer

        model = value_model_from_policy(spec, device=options.pop("device", "cpu"))
        return cls(model, load_tokenizer(spec), **options)


def pair_accuracy(rm: RewardModel, pairs: Sequence[PreferencePair]) -> float:
    """Held-out pairwise accuracy: the share of pairs whose chosen response scores higher (ties count ½)."""
    prompts = [p.prompt for p in pairs]
    chosen = torch.tensor(rm.score(prompts, [p.chosen for p in pairs]))
    rejected = torch.tensor(rm.score(prompts, [p.rejected for p in pairs]))
    return pairwise_accuracy(chosen, rejected)


def _batches(pairs: Sequence[PreferencePair], size: int, seed: int) -> Iterator[list[PreferencePair]]:
    rng = random.Random(seed)
    while True:
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for start in range(0, len(order) - size + 1, size):
            yield [pairs[i] for i in order[start : start + size]]


def train_bradley_terry(
    rm: RewardModel,
    pairs: Sequence[PreferencePair],
    *,
    steps: int,
    batch_pairs: int = 8,
    micro_pairs: int = 4,
    lr: float = 1e-5,
    head_lr: float = 1e-3,
    seed: int = 0,
    on_step=None,
) -> list[dict[str, float]]:
    """Minimise the Bradley-Terry loss for ``steps`` optimiser steps; returns per-step metrics.

    The zero-initialised head gets its own, larger learning rate.  A non-finite gradient skips the step.
    """
    head = list(rm.model.head.parameters())
    backbone = [p for n, p in rm.model.named_parameters() if not n.startswith("head.")]
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": lr}, {"params": head, "lr": head_lr}], weight_decay=0.0)
    history = []
    rm.model.train()
    for step, batch in zip(range(1, steps + 1), _batches(pairs, min(batch_pairs, len(pairs)), seed), strict=False):
        loss_sum = correct = 0.0
        for start in range(0, len(batch), micro_pairs):
            micro = batch[start : start + micro_pairs]
            rows = [rm.encode(p.prompt, p.chosen) for p in micro] + [rm.encode(p.prompt, p.rejected) for p in micro]
            scores = rm.forward_scores(rows)  # [2m]
            chosen, rejected = scores[: len(micro)], scores[len(micro) :]
            loss = bradley_terry_loss(chosen, rejected) * len(micro) / len(batch)
            loss.backward()
            loss_sum += loss.item()
            correct += (chosen > rejected).sum().item()
        grad_norm = apply_gradients(rm.model, optimizer, 1.0)
        record = {"step": step, "loss": loss_sum, "train_accuracy": correct / len(batch), "grad_norm": grad_norm}
        history.append(record)
        if on_step is not None:
            on_step(record)
    rm.model.eval()
    return history
