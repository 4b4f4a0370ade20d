"""Rollout engines behind one protocol; heavy engines are imported lazily by name."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.rollout.base import Completion, RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "build_engine"]


def build_engine(
    name: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    vllm_options: Mapping[str, Any] | None = None,
    **options,
) -> RolloutEngine:
    """The engine called ``name`` (``fast``, ``hf``, ``vllm`` or ``auto``), serving its own copy of ``model``'s weights.

    ``options`` go to any engine; ``vllm_options`` (rollout.vllm settings) only to the vLLM engine.

    ``auto`` picks ``fast`` for a CPU model whose architecture it supports, ``vllm`` on a CUDA machine
    where vLLM is installed, else ``hf``.
    """
    if name == "auto":
        from reasonrl.rollout.fast import SUPPORTED

        if torch.cuda.is_available():
            name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
        else:
            name = "fast" if model.config.model_type in SUPPORTED else "hf"
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "fast":
        from reasonrl.rollout.fast import FastEngine

        return FastEngine(model, tokenizer, **options)
    if name == "vllm":
        from reasonrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **options, **(vllm_options or {}))
    raise ValueError(f"unknown rollout engine {name!r}; available: auto, fast, hf, vllm")
