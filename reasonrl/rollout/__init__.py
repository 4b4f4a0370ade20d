"""Rollout engines behind one protocol; heavy engines are imported lazily by name."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams

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
    """The engine called ``name`` (``fast``, ``hf``, ``paged``, ``vllm`` or ``auto``), serving its own copy of
    ``model``'s weights.

    ``options`` go to any engine; ``vllm_options`` (rollout.vllm settings) only to the vLLM engine.

    ``auto`` picks, for a model on a CUDA device, ``vllm`` where vLLM is installed, else ``hf``; for a
    CPU model ``fast`` where it supports the architecture, else ``hf``.  A vision-language model
    generates with ``vllm`` (on CUDA, where installed) or ``hf``: the fast engine is text-only.
    """
    from reasonrl.models.load import ModelError
    from reasonrl.rollout.fast import SUPPORTED

    on_cuda = next(model.parameters()).device.type == "cuda"
    vision_language = hasattr(model.config, "vision_config")
    if name == "auto":
        if on_cuda:
            name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
        else:
            name = "fast" if model.config.model_type in SUPPORTED and not vision_language else "hf"
    if vision_language and name == "fast":
        raise ModelError(
            "rollout.engine=fast cannot generate from images (it is text-only); a vision-language model "
            "generates with rollout.engine=hf or vllm (or auto)"
        )
    if name == "fast" and on_cuda:
        raise ModelError("the fast engine generates on the CPU; with model.device=cuda use rollout.engine=vllm or hf")
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, **options)
    if name == "paged":
        from reasonrl.rollout.paged import PagedEngine

        return PagedEngine(model, tokenizer, **options)
    if name == "fast":
        from reasonrl.rollout.fast import FastEngine

        return FastEngine(model, tokenizer, **options)
    if name == "vllm":
        from reasonrl.rollout.vllm import VLLMEngine

        return VLLMEngine(model, tokenizer, **options, **(vllm_options or {}))
    raise ValueError(f"unknown rollout engine {name!r}; available: auto, fast, hf, paged, vllm")
