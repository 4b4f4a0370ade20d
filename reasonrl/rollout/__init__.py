"""Rollout engines behind one protocol; heavy engines are imported lazily by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reasonrl.rollout.base import Completion, RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **options) -> RolloutEngine:
    """The engine called ``name`` (``hf``), serving a copy of ``model``."""
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}; available: hf")
