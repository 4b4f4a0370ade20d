"""The critic: a causal-LM backbone with a scalar head, V(s_t) at every response token.

A value model is saved as a directory: the backbone in Hugging Face format (``config.json`` +
``model.safetensors``, loadable with ``AutoModel``) plus ``value_head.safetensors``.  A
Bradley-Terry reward model uses the same layout, so a critic can start from one (VAPO §5.1).

The Hugging Face reward-model format (``AutoModelForSequenceClassification`` with ``num_labels=1``,
what TRL's and OpenRLHF's reward trainers write) goes both ways: ``load_value_model`` reads one (a
local directory or a hub id) as a backbone and its ``score`` layer, and ``export_sequence_classifier``
writes a value model in it.  That layer has no bias; a non-zero head bias travels in the config
(``reasonrl_score_bias``), which only reasonrl reads back (a preference score's bias cancels anyway).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from torch.nn import functional as F

from reasonrl.models.forward import response_hidden_states
from reasonrl.models.load import ModelError, load_model, without_dropout
from reasonrl.models.lora import save_hf_directory
from reasonrl.models.untrusted import check_safetensors
from reasonrl.models.varlen_attention import transformers_attention

HEAD_FILE = "value_head.safetensors"
SCORE_BIAS_KEY = "reasonrl_score_bias"  # the config entry of an exported head's bias
EXPORTED_KEY = "reasonrl_value_model"  # marks a config as written by export_sequence_classifier


class ValueModel(torch.nn.Module):
    """V(s_t) = w·h_t + b, with h_t the backbone's last hidden state before response token t."""

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = without_dropout(backbone)  # the critic's passes compute one function, as the policy's
        if head is None:
            # zero head: V ≡ 0 at the start, so the critic carries no initial bias (VC-PPO's diagnosis)
            head = torch.nn.Linear(backbone.config.get_text_config().hidden_size, 1)  # a VLM's: its LM's
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
        vision: dict[str, Tensor] | None = None,  # a VLM's pixel inputs per row
        packed: bool = True,  # the rows as one sequence without padding (models.forward.response_hidden_states)
        share_prompts: bool = False,  # a prompt several rows share read once (ditto)
    ) -> Tensor:
        """V(s_t) for every response token, fp32 [B, T]; 0 at masked positions."""
        rows = (prompt_ids, prompt_mask, response_ids, response_mask)
        hidden = response_hidden_states(self.backbone, *rows, compute_dtype, vision, packed, share_prompts)  # [B, T, d]
        # the d -> 1 head is cheap in fp32, whatever its weights are stored in
        values = F.linear(hidden.float(), self.head.weight.float(), self.head.bias.float()).squeeze(-1)  # [B, T]
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
        "`reasonrl rm train --kind bt` (or --kind prm for a PRM), a critic-based run's critic_pretrained/ "
        "or checkpoint critic/, or a Hugging Face sequence-classification reward model"
    )


def is_sequence_classifier(spec: str | Path) -> bool:
    """Whether ``spec`` is a local Hugging Face sequence-classification model: a directory whose config names a
    ``...ForSequenceClassification`` architecture and that holds no reasonrl value head."""
    import json

    path = Path(spec)
    if not (path / "config.json").exists() or (path / HEAD_FILE).exists():
        return False
    architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    return any(name.endswith("ForSequenceClassification") for name in architectures)


def exported_by_reasonrl(spec: str | Path) -> bool:
    """Whether a local sequence-classification directory was written by ``export_sequence_classifier``."""
    import json

    config = Path(spec) / "config.json"
    return config.exists() and bool(json.loads(config.read_text()).get(EXPORTED_KEY))


def load_sequence_classifier(spec: str | Path, attn_implementation: str | None = None) -> ValueModel:
    """A Hugging Face reward model (``AutoModelForSequenceClassification``, one label) as a ValueModel: its base
    model as the backbone, its ``score`` layer as the head (fp32)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(spec))
    architectures = getattr(config, "architectures", None) or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures) or config.num_labels != 1:
        raise ModelError(
            f"{spec}: not a one-label sequence-classification reward model (architectures {architectures}, "
            f"{config.num_labels} labels); a causal LM has no trained reward head"
        )
    options = {"attn_implementation": transformers_attention(attn_implementation, config)}
    options = options if attn_implementation else {}
    classifier, loading = AutoModelForSequenceClassification.from_pretrained(
        str(spec),
        num_labels=1,
        dtype=torch.float32,
        output_loading_info=True,
        **check_safetensors(str(spec), str(spec)),
        **options,
    )
    score = getattr(classifier, "score", None)
    if not isinstance(score, torch.nn.Linear) or any("score" in key for key in loading.get("missing_keys", ())):
        raise ModelError(f"{spec}: its checkpoint holds no trained `score` layer (a scalar reward model's head)")
    head = torch.nn.Linear(score.in_features, 1)
    with torch.no_grad():
        head.weight.copy_(score.weight)
        head.bias.fill_(float(getattr(classifier.config, SCORE_BIAS_KEY, 0.0)))
    return ValueModel(getattr(classifier, classifier.base_model_prefix), head).eval()


def export_sequence_classifier(model: ValueModel, tokenizer, directory: Path) -> Path:
    """Write ``model`` as a Hugging Face reward model: ``AutoModelForSequenceClassification.from_pretrained``
    loads it with one label (TRL, OpenRLHF); it scores the hidden state of the last non-padding token."""
    import copy

    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(model.backbone.config)
    config.num_labels, config.architectures = 1, None
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    setattr(config, EXPORTED_KEY, True)  # reasonrl reads it back where it trained it: after the reply's text
    setattr(config, SCORE_BIAS_KEY, float(model.head.bias.detach()))  # always: an older export's bias is stale
    classifier = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    getattr(classifier, classifier.base_model_prefix).load_state_dict(model.backbone.state_dict())
    with torch.no_grad():
        classifier.score.weight.copy_(model.head.weight)
    directory.mkdir(parents=True, exist_ok=True)
    classifier.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_value_model(directory: str | Path, attn_implementation: str | None = None) -> ValueModel:
    """A critic or reward model saved by ``ValueModel.save`` (fp32); an `rm train` output directory, or a
    Hugging Face sequence-classification reward model (local or a hub id), works too."""
    from transformers import AutoModel

    if is_sequence_classifier(directory):
        return load_sequence_classifier(directory, attn_implementation)
    try:
        directory = value_model_dir(directory)
    except ModelError as missing:
        owner = Path(str(directory).split("/")[0])
        if str(directory).count("/") != 1 or owner.exists():  # a local path (runs/prm), not owner/name
            raise
        try:  # owner/name: a reward model on the hub, where a network exists
            return load_sequence_classifier(str(directory), attn_implementation)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{missing}; as a hub id it failed too: {exc}") from None
    options = {"attn_implementation": transformers_attention(attn_implementation, directory)}
    options = options if attn_implementation else {}
    safe = check_safetensors(str(directory), str(directory))
    backbone = AutoModel.from_pretrained(directory, dtype=torch.float32, **safe, **options)
    tensors = load_file(directory / HEAD_FILE)
    head = torch.nn.Linear(tensors["weight"].shape[1], 1)
    head.load_state_dict(tensors)
    return ValueModel(backbone, head).eval()
