"""The critic: a causal-LM backbone with a scalar head, V(s_t) at every response token.

A value model is saved as a directory: the backbone in Hugging Face format (``config.json`` +
``model.safetensors``, loadable with ``AutoModel``) plus ``value_head.safetensors``.  A
Bradley-Terry reward model uses the same layout, so a critic can start from one (VAPO §5.1).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from reasonrl.models.forward import response_hidden_states
from reasonrl.models.load import ModelError, load_model
from reasonrl.models.lora import save_hf_directory

HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    """V(s_t) = w·h_t + b, with h_t the backbone's last hidden state before response token t."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        if head is None:
            # zero head: V ≡ 0 at the start, so the critic carries no initial bias (VC-PPO's diagnosis)
            head = torch.nn.Linear(backbone.config.hidden_size, 1)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        self.head = head

    def forward(
        self,
        prompt_ids: Tensor,  # [B, P] left-padded
        prompt_mask: Tensor,  # [B, P]
        response_ids: Tensor,  # [B, T] right-padded
        response_mask: Tensor,  # [B, T]
        compute_dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """V(s_t) for every response token, fp32 [B, T]; 0 at masked positions."""
        hidden = response_hidden_states(
            self.backbone, prompt_ids, prompt_mask, response_ids, response_mask, compute_dtype
        )  # [B, T, d]
        values = self.head(hidden.float()).squeeze(-1)  # [B, T]; the d -> 1 head is cheap in fp32
        return values * response_mask.to(values.device)

    def save(self, directory: Path) -> Path:
        """Write the backbone (Hugging Face format; with LoRA merged, plus ``adapter/``) and the head."""
        directory.mkdir(parents=True, exist_ok=True)
        save_hf_directory(self.backbone, directory)
        head = {"weight": self.head.weight.detach().cpu().contiguous(), "bias": self.head.bias.detach().cpu()}
        save_file(head, directory / HEAD_FILE)
        return directory


def rescale_head(model: ValueModel, scale: float, shift: float) -> ValueModel:
    """Make the model predict ``shift + scale·V`` (an affine map of its head): how a PRM's success
    probability becomes a critic on the reward scale."""
    with torch.no_grad():
        model.head.weight.mul_(scale)
        model.head.bias.mul_(scale).add_(shift)
    return model


def value_model_from_policy(
    spec: str, attn_implementation: str | None = None, device: torch.device | str = "cpu"
) -> ValueModel:
    """A critic whose backbone is a copy of the policy's (fp32) with a fresh zero head, on ``device``."""
    causal_lm = load_model(spec, torch.float32, attn_implementation, device)
    return ValueModel(causal_lm.base_model).to(device)


def value_model_dir(directory: str | Path) -> Path:
    """The directory of a saved value model: ``directory`` itself, or its ``model/`` when it is the output
    directory of `reasonrl rm train`."""
    directory = Path(directory)
    for candidate in (directory, directory / "model"):
        if (candidate / HEAD_FILE).exists():
            return candidate
    raise ModelError(
        f"{directory} is not a saved value model (no {HEAD_FILE}); give the --out directory of "
        "`reasonrl rm train --kind bt` (or --kind prm for a PRM), or a critic-based run's critic_pretrained/ "
        "or checkpoint critic/"
    )


def load_value_model(directory: str | Path, attn_implementation: str | None = None) -> ValueModel:
    """A critic or reward model saved by ``ValueModel.save`` (fp32); an `rm train` output directory works too."""
    from transformers import AutoModel

    directory = value_model_dir(directory)
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    backbone = AutoModel.from_pretrained(directory, dtype=torch.float32, **options)
    tensors = load_file(directory / HEAD_FILE)
    head = torch.nn.Linear(tensors["weight"].shape[1], 1)
    head.load_state_dict(tensors)
    return ValueModel(backbone, head).eval()
