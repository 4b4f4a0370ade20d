"""LoRA (Hu et al. 2021, arXiv:2106.09685) through PEFT: low-rank adapters on a model's linear layers.

Each target weight W [out, in] gains W' = W + (α / r)·B·A with A [r, in] and B [out, r]; B starts at zero,
so a fresh adapter leaves the model unchanged.  Only A and B train: the base weights stay frozen and
bit-identical, and with them the KL reference (the base with its adapters switched off) costs no copy.

The adapter is PEFT's ``LoraConfig`` injected in place with PEFT's ``inject_adapter_in_model`` (not
transformers' ``add_adapter`` integration, which refuses PEFT versions it was not released with), so a
LoRA model is still a ``PreTrainedModel``: the policy's chunked
log-prob forward, the critic's backbone and every engine take it unchanged.  Its ``state_dict`` names
change (``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight``), so the engines receive
``merged_state_dict``: the plain model's names, the adapters folded in.

A saved LoRA model directory holds the merged weights in Hugging Face format (``from_pretrained`` loads
it) and the adapter in ``adapter/`` (``PeftModel.from_pretrained(base, directory / "adapter")`` loads it;
a resumed run loads the adapter alone onto the base it reloads).  PEFT is imported only when a model
gets an adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from reasonrl.models.load import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from reasonrl.config.schema import ModelConfig

ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_NAME = "default"  # PEFT's name for a model's only adapter
PEFT_PREFIX = "base_model.model."  # what PEFT's adapter files put before the model's own names
ADAPTER_MARK = "lora_"  # in the name of every adapter tensor (lora_A, lora_B), in no base tensor


def add_lora(model: PreTrainedModel, settings: ModelConfig) -> PreTrainedModel:
    """Give ``model`` a trainable LoRA adapter (in place) when ``settings.lora_rank > 0``; returns ``model``.

    Everything but the adapter is frozen (``requires_grad=False``).  A's initialisation draws from
    torch's RNG (seeded by the run).  No dropout on the adapter: the PPO ratio of the first mini-batch
    stays exactly 1, as with full fine-tuning.  The adapter is fp32 whatever the base is stored in (PEFT's
    ``autocast_adapter_dtype``, which ``inject_adapter_in_model`` does not apply): its small matmuls run in fp32
    and the optimiser needs no master copy of it.
    """
    if settings.lora_rank <= 0:
        return model
    from peft import LoraConfig, inject_adapter_in_model

    targets = settings.lora_target_modules
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=0.0,
        bias="none",
    )
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # PEFT: no module matched the targets
        raise ModelError(
            f"model.lora_target_modules={targets!r} matches no layer of this model ({exc}); "
            "use 'all-linear' or names of its linear layers such as [q_proj, v_proj]"
        ) from None
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(ADAPTER_MARK in name)
        if ADAPTER_MARK in name and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    return model


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries a PEFT adapter (PEFT attaches its configs to the injected model)."""
    return bool(getattr(model, "peft_config", None))


def merged_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights under the plain model's names, each adapter folded in: W + (α / r)·B·A.

    A model without an adapter gives its ``state_dict()``.  ``model`` is not modified (merging in
    place and unmerging would round the frozen base).
    """
    if not has_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer):
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in module.active_adapters)
        merged: dict[str, Tensor] = {}
        for key, tensor in model.state_dict().items():
            parts = key.split(".")
            if any(part.startswith(ADAPTER_MARK) for part in parts):  # the adapter's own A, B (and embedding) tensors
                continue
            plain = ".".join(part for part in parts if part != "base_layer")
            # added in the delta's fp32, rounded once to the base's dtype (as PEFT's merge_and_unload)
            merged[plain] = (tensor + deltas[plain]).to(tensor.dtype) if plain in deltas else tensor
    return merged


@contextlib.contextmanager
def adapters_disabled(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """``model`` with its adapters switched off: the frozen base, which is a LoRA run's KL reference."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def save_lora_model(model: PreTrainedModel, directory: Path) -> Path:
    """Write the merged model in Hugging Face format to ``directory`` and its adapter to ``directory/adapter``."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_without_shared(merged_state_dict(model)), directory / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)
    _save_adapter(model, directory / ADAPTER_DIR)
    return directory


def _save_adapter(model: PreTrainedModel, directory: Path) -> None:
    """The adapter alone in PEFT's format (``adapter_config.json`` and its tensors under a ``PeftModel``'s
    names), so ``PeftModel.from_pretrained(base, directory)`` loads it."""
    from peft import get_peft_model_state_dict

    directory.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)
    tensors = {PEFT_PREFIX + name: tensor.contiguous() for name, tensor in state.items()}
    save_file(tensors, directory / ADAPTER_FILE, metadata={"format": "pt"})
    model.peft_config[ADAPTER_NAME].save_pretrained(directory)


def save_hf_directory(model: PreTrainedModel, directory: Path) -> Path:
    """``directory`` as a Hugging Face model directory: ``save_pretrained``, or with an adapter the merged
    model plus ``adapter/`` (``save_lora_model``)."""
    if has_lora(model):
        return save_lora_model(model, directory)
    model.save_pretrained(directory)
    return directory


def _without_shared(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Tied tensors (the LM head that shares the embedding) once, under their first name, as
    ``save_pretrained`` stores them; ``from_pretrained`` ties them again."""
    seen: set[int] = set()
    kept = {}
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            kept[name] = tensor.contiguous()
    return kept


def load_lora_adapter(model: PreTrainedModel, directory: Path) -> None:
    """Copy the adapter saved in ``directory/adapter`` into ``model``'s adapter, in place (its parameters,
    and so an optimiser that holds them, stay the same objects)."""
    from peft import set_peft_model_state_dict

    saved = load_file(directory / ADAPTER_DIR / ADAPTER_FILE)
    state = {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in saved.items()}
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER_NAME)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ModelError(f"the adapter in {directory / ADAPTER_DIR} does not fit this model: {unexpected[:3]}")
