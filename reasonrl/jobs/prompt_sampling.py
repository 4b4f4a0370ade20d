"""What the data jobs (``data select``, ``data bon``, ``data sample``, ``prm label``) share: the prompts they
read, the initial policy that samples their responses, and the prompt files they write."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reasonrl.config import Config
from reasonrl.config.plan import vllm_engine_options
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError, Fields, default_split, load_examples
from reasonrl.data.prompts import PromptEncoder
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device, vision_processor
from reasonrl.rollout import build_engine

SCORING_CHUNK = 32  # prompts sampled and scored per call (the progress bar advances by this much)


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


def stable_seed(*parts: object) -> int:
    """A 32-bit seed made of ``parts``, the same in every process (``hash`` of a string is salted per process):
    a resumed job samples what an uninterrupted one would have."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")
