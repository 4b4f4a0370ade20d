"""A few samples of each step as text (``run.log_samples``, TRL's ``log_completions``): ``samples.jsonl`` in the run
directory, and each tracker (a TensorBoard text panel, a wandb table, an MLflow JSON artifact).

A sample is one row of the step's batch, chosen at random (seeded by the run's seed and the step): its prompt,
its completion (special tokens skipped, a conversation's tool calls and answers included), and for a
conversation its turns, each with who wrote it and its reward; its reward, verdict, mean advantage over its
loss tokens, length, and whether it hit the token cap.  What the model wrote, and why it was rewarded so, is
there to read without generating it again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reasonrl.algo.masked import masked_mean
from reasonrl.batch import RolloutBatch
from reasonrl.rollout.multiturn.episodes import ROLE_INJECTED
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.record.trackers import Tracker

SAMPLES_FILE = "samples.jsonl"


def step_samples(batch: RolloutBatch, tokenizer: Any, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rows of ``batch`` (seeded choice, in row order) as readable records (the module docstring)."""
    rows = sorted(random.Random(seed).sample(range(len(batch)), min(count, len(batch))))
    return [row_sample(batch, tokenizer, row) for row in rows]


def row_sample(batch: RolloutBatch, tokenizer: Any, row: int) -> dict[str, Any]:
    """Row ``row`` of ``batch`` as a record."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
    generated = batch.response_mask[row].bool()
    length = int(generated.nonzero().max()) + 1 if generated.any() else 0  # up to the last generated token
    response = batch.response_ids[row][:length].tolist()
    record: dict[str, Any] = {
        "prompt": tokenizer.decode(prompt, skip_special_tokens=True),
        "completion": tokenizer.decode(response, skip_special_tokens=True),
        "reward": float(batch.rewards[row]),
        "correct": bool(batch.correct[row]),
        "advantage": masked_mean(batch.advantages[row], batch.policy_loss_mask[row]).item()
        if batch.advantages is not None and batch.policy_loss_mask[row].any()
        else None,
        "response_tokens": int(generated.sum()),
        "truncated": bool(batch.truncated[row]),
    }
    if batch.turns is not None:
        record["turns"] = turns_of(batch, tokenizer, row, length)
    return record


def turns_of(batch: RolloutBatch, tokenizer: Any, row: int, length: int) -> list[dict[str, Any]]:
    """A conversation's turns in order: who wrote each (``policy``, or ``environment`` for what was injected:
    a tool's answer, a game's feedback), its text and the reward on its last token."""
    assert batch.turns is not None
    ids, roles = batch.response_ids[row][:length].tolist(), batch.turns.role_ids[row][:length].tolist()
    rewards = batch.turns.rewards[row][:length].tolist()
    turns: list[dict[str, Any]] = []
    start = 0
    for end in range(1, length + 1):
        if end == length or roles[end] != roles[start]:
            by = "environment" if roles[start] == ROLE_INJECTED else "policy"
            text = tokenizer.decode(ids[start:end], skip_special_tokens=True)
            turns.append({"by": by, "text": text, "reward": float(sum(rewards[start:end]))})
            start = end
    return turns


class SampleLog:
    """Appends each step's samples to ``samples.jsonl`` (a line per sample, with its step) and gives them to the
    trackers; a resumed run first drops the samples of the steps it replays."""

    def __init__(self, run_dir: Path, resume_step: int, trackers: Sequence[Tracker]) -> None:
        self.path = run_dir / SAMPLES_FILE
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step] if resume_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.trackers = list(trackers)

    def write(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Record one step's samples."""
        if not samples:
            return
        with self.path.open("a") as handle:
            handle.writelines(json.dumps({"step": step, **sample}) + "\n" for sample in samples)
        for tracker in self.trackers:
            tracker.log_samples(step, samples)
