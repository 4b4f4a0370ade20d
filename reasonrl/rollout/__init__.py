"""Rollout engines behind one protocol; heavy engines are imported lazily by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reasonrl.rollout.base import Completion, RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **options) -> RolloutEngine:
    """The engine called ``name`` (``fast``, ``hf``, or ``auto``), serving its own copy of ``model``'s weights.

    ``auto`` picks ``fast`` for a model on the CPU whose architecture it supports, else ``hf``.
    """
    if name == "auto":
        from reasonrl.rollout.fast import SUPPORTED

        on_cpu = next(model.parameters()).device.type == "cpu"
        name = "fast" if on_cpu and model.config.model_type in SUPPORTED else "hf"
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "fast":
        from reasonrl.rollout.fast import FastEngine

        return FastEngine(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {name!r}; available: auto, fast, hf")
