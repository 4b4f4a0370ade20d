"""``resolve(cfg, device_type, world_size) -> Plan``: what a run derives from its config on the device it trains
on, computed once (a run's setup resolves it, and the producer process receives it), config untouched."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any

from reasonrl.config.config_error import ConfigError
from reasonrl.config.schema import Config
from reasonrl.config.validate import validate

OVERLONG_CACHE_FRACTION = 0.2  # DAPO: L_cache = 4096 of the 20480-token cap


@dataclass(frozen=True)
class Plan:
    """Derived quantities of a run."""

    sequences_per_rollout: int
    """Responses trained on per rollout step: rollout_prompts × samples_per_prompt (offline: minibatch_sequences)."""

    minibatches_per_rollout: int
    """Optimiser steps per epoch over a rollout batch: sequences_per_rollout / minibatch_sequences."""

    optimizer_steps_per_rollout: int
    """Optimiser steps per rollout step: epochs_per_rollout × minibatches_per_rollout."""

    total_optimizer_steps: int
    """Optimiser steps of the whole run."""

    warmup_optimizer_steps: int
    """Optimiser steps of the linear learning-rate warm-up."""

    prompts_per_generation_pass: int
    """Prompts sampled per generation pass (more than rollout_prompts when dynamic sampling over-samples)."""

    uses_critic: bool
    """A value model is trained (gae / egae estimators)."""

    uses_reference: bool
    """A frozen reference policy is loaded (when a KL term is on, and for the offline objectives)."""

    critic_lr: float | None
    """The critic's learning rate, or None without a critic."""

    value_pretrain_steps: int
    """Critic-only steps before RL (0 when a saved critic is loaded)."""

    loss_agg_constant: float | None
    """C of seq-mean-token-sum-norm, or None for the other modes."""

    overlong_cache_tokens: int | None
    """L_cache of the soft overlong punishment, or None when it is off."""

    max_sequence_tokens: int
    """Longest prompt + response a forward pass may see."""

    gradient_checkpointing: bool
    """model.gradient_checkpointing with auto resolved: off here; the run's setup turns it on where the memory plan
    (``models.memory_plan.plan_memory``) says the run does not fit without it."""

    separate_old_logprob_pass: bool
    """Old log-probs need their own forward pass before the update.  Not when a rollout is a single
    mini-batch trained for one epoch without a reference or FIRE behaviour log-probs: the update's
    own forward then runs at the old policy, and its detached log-probs serve (as TRL does).  Always
    when T-PPO trains on earlier windows' tokens, whose old log-probs are the stored behaviour ones."""

    rollout_correction: str
    """algo.rollout_correction with auto resolved: none in a synchronous run, decoupled in an asynchronous one."""

    rollout_correction_threshold: float
    """algo.rollout_correction_threshold, or its mode's default (decoupled 5.0, tis and mis 2.0)."""

    partial_window_tokens: int | None
    """rollout.partial_window_tokens, or a quarter of max_response_tokens; None without partial rollouts."""

    device_type: str
    """The device type the run trains on ("cpu" or "cuda"): model.device, auto as this machine resolves it."""

    world_size: int
    """Trainer ranks the models are sharded over (FSDP2): dist.trainer_workers under Ray, torchrun's WORLD_SIZE."""

    microbatch_tokens: int
    """The token budget of one forward micro-batch: train.microbatch_tokens, or the device's default (null, and auto
    until the run's setup takes the memory plan's choice: ``models.memory_plan.auto_microbatch_plan``)."""

    attention: str
    """The trainer's attention kernel: model.attention with auto resolved for the device and the sequence cap."""

    layer_kernels: str
    """The trainer's RMSNorm, RoPE and SwiGLU kernels ("liger" or "torch"): model.kernels with auto resolved."""

    logprob_head: str
    """The training LM head ("chunked" or "liger"): model.logprob_head with auto resolved."""

    forward_dtype: str
    """What forward passes run in ("float32" or "bfloat16"): model.dtype with auto resolved for the device;
    bfloat16 wherever the trained weights are stored in it."""

    parameter_dtype: str
    """What the trained weights are stored in (train.param_dtype); their gradients are summed in fp32."""

    @property
    def forward_torch_dtype(self):
        """``forward_dtype`` as a torch dtype."""
        import torch

        return getattr(torch, self.forward_dtype)

    @property
    def parameter_torch_dtype(self):
        """``parameter_dtype`` as a torch dtype."""
        import torch

        return getattr(torch, self.parameter_dtype)


PARTIAL_WINDOWS_PER_RESPONSE = 4  # partial rollouts' default window: a quarter of the response cap (our choice)
CORRECTION_THRESHOLDS = {"none": 1.0, "decoupled": 5.0, "tis": 2.0, "mis": 2.0}  # AReaL's cap; verl's threshold


def resolve(cfg: Config, device_type: str | None = None, world_size: int | None = None) -> Plan:
    """Validate ``cfg`` and derive its Plan on ``device_type`` ("cpu" or "cuda"; default: model.device on this
    machine) with ``world_size`` trainer ranks (default: the launcher's); the config itself is never changed."""
    validate(cfg)
    device_type = device_type or planned_device_type(cfg)
    world_size = world_size or planned_world_size(cfg)
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    offline = a.offline != "none"  # one optimiser step per step, on one mini-batch of the offline dataset
    sequences = t.minibatch_sequences if offline else r.rollout_prompts * r.samples_per_prompt
    minibatches = sequences // t.minibatch_sequences
    per_rollout = 1 if offline else t.epochs_per_rollout * minibatches
    prompts_per_pass = math.ceil(a.oversample_factor * r.rollout_prompts) if a.dynamic_sampling else r.rollout_prompts
    cache = None
    if a.overlong == "soft":
        default_cache = max(1, round(OVERLONG_CACHE_FRACTION * r.max_response_tokens))
        cache = a.overlong_cache_tokens if a.overlong_cache_tokens is not None else default_cache
    constant = None
    if a.loss_agg == "seq-mean-token-sum-norm":
        constant = a.loss_agg_constant if a.loss_agg_constant is not None else float(r.max_response_tokens)
    correction = a.rollout_correction
    if correction == "auto":
        correction = "decoupled" if r.max_staleness else "none"
    threshold = a.rollout_correction_threshold or CORRECTION_THRESHOLDS[correction]
    longest = r.max_prompt_tokens + r.max_response_tokens
    window = None
    if r.partial_rollouts:
        window = r.partial_window_tokens or max(1, r.max_response_tokens // PARTIAL_WINDOWS_PER_RESPONSE)
    return Plan(
        sequences_per_rollout=sequences,
        minibatches_per_rollout=minibatches,
        optimizer_steps_per_rollout=per_rollout,
        total_optimizer_steps=per_rollout * t.rollout_steps,
        warmup_optimizer_steps=per_rollout * t.warmup_rollout_steps,
        prompts_per_generation_pass=prompts_per_pass,
        uses_critic=a.uses_critic,
        uses_reference=offline or (a.kl_placement != "none" and a.kl_coef > 0),
        critic_lr=(cfg.critic.lr if cfg.critic.lr is not None else 2.0 * t.lr) if a.uses_critic else None,
        value_pretrain_steps=(
            a.value_pretrain_steps if a.uses_critic and not offline and cfg.critic.init != "checkpoint" else 0
        ),
        loss_agg_constant=constant,
        overlong_cache_tokens=cache,
        max_sequence_tokens=longest,
        gradient_checkpointing=cfg.model.gradient_checkpointing is True,
        separate_old_logprob_pass=not (
            per_rollout == 1
            and not (a.kl_placement != "none" and a.kl_coef > 0)
            and not (r.fire.enabled and r.fire.logprob == "behaviour")
            and a.policy_tokens == "window"
        ),
        rollout_correction=correction,
        rollout_correction_threshold=threshold,
        partial_window_tokens=window,
        device_type=device_type,
        world_size=world_size,
        microbatch_tokens=microbatch_token_budget(cfg, device_type),
        attention=attention_implementation(
            cfg.model.attention,
            device_type,
            attended_span(cfg, device_type, longest),
            packed=cfg.train.pack_sequences,
            forward_dtype=forward_dtype_name(cfg, device_type),
        ),
        forward_dtype=forward_dtype_name(cfg, device_type),
        parameter_dtype=t.param_dtype,
        layer_kernels=layer_kernels_choice(cfg.model.kernels, device_type),
        logprob_head=logprob_head_choice(cfg.model.logprob_head, device_type, a.entropy_coef),
    )


def planned_device_type(cfg: Config) -> str:
    """model.device as a run resolves it on this machine: auto = cuda when a GPU is visible."""
    import torch

    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.model.device


def planned_world_size(cfg: Config) -> int:
    """FSDP2 ranks the run trains on: dist.trainer_workers under Ray, else torchrun's WORLD_SIZE (1 outside it)."""
    if cfg.dist.backend == "ray":
        return cfg.dist.trainer_workers
    return int(os.environ.get("WORLD_SIZE", "1"))


EAGER_ATTENTION_MAX_TOKENS = 512
"""Sequences (or lanes, with model.attention=lanes) up to this length run eager attention on the CPU: its forward +
backward beat SDPA's there (per layer of SmolLM2-135M, bf16, 2 cores, 2026-11-30: 7.4 against 13.6 ms for 3 lanes of
230 tokens, 11.8 against 18.3 ms for one of 512); longer ones SDPA, which keeps no [T, T] probabilities."""


def attended_span(cfg: Config, device_type: str, max_sequence_tokens: int) -> int:
    """The longest sequence one attention call of the trainer reads: the longest prompt + response, or with
    train.share_prompts on the CPU a segment of rows sharing a prompt (docs/packing.md): the prompt once and
    rollout.samples_per_prompt responses, at most a micro-batch.  (A prompt drawn twice into one batch makes a
    longer segment, up to the micro-batch budget: attention then reads a wider lane, no less exactly.)"""
    if cfg.train.pack_sequences and cfg.train.share_prompts and device_type == "cpu":
        r = cfg.rollout
        segment = r.max_prompt_tokens + r.samples_per_prompt * r.max_response_tokens
        return max(max_sequence_tokens, min(segment, microbatch_token_budget(cfg, device_type)))
    return max_sequence_tokens


def attention_implementation(
    name: str, device_type: str, max_sequence_tokens: int, packed: bool = True, forward_dtype: str = "bfloat16"
) -> str:
    """The trainer's attention kernel of ``model.attention`` on ``device_type``.

    auto: on the CPU lanes for packed sequences (``models.varlen_attention``: every op but attention over the read
    tokens alone, attention eager or SDPA by the lane's width), else eager for sequences up to 512 tokens, where
    its backward beats SDPA's (`python bench/dtype.py`, key train_eager_over_sdpa), and SDPA above, where eager's
    saved T×T attention matrices would cost too much memory; on a GPU flash-attn 2 when installed, else SDPA.
    flash_attention_2 asked for explicitly needs a GPU and the flash-attn package; varlen a GPU, a torch with
    ``torch.nn.attention.varlen``, packed sequences and bf16 forwards (``packed``, ``forward_dtype``); lanes packed
    sequences: a ConfigError naming what is missing otherwise."""
    flash = importlib.util.find_spec("flash_attn") is not None
    if name == "flash_attention_2" and (device_type != "cuda" or not flash):
        raise ConfigError(
            "model.attention=flash_attention_2 needs a CUDA device and the flash-attn package "
            f"({'installed' if flash else 'not installed'}, device {device_type}); use auto or sdpa"
        )
    if name == "varlen":
        has_varlen = importlib.util.find_spec("torch.nn.attention.varlen") is not None
        missing = [
            *([f"a CUDA device (this run's: {device_type})"] if device_type != "cuda" else []),
            *([] if has_varlen else ["torch >= 2.10 (its nn.attention.varlen)"]),
            *([] if packed else ["train.pack_sequences=true (it reads one packed sequence)"]),
            *([] if forward_dtype == "bfloat16" else [f"bf16 forwards (this run's: {forward_dtype})"]),
        ]  # fmt: skip
        if missing:
            raise ConfigError(f"model.attention=varlen needs {', '.join(missing)}; use auto or sdpa")
    if name == "lanes" and not packed:
        raise ConfigError("model.attention=lanes needs train.pack_sequences=true (it reads one packed sequence)")
    if name != "auto":
        return name
    if device_type == "cuda":
        return "flash_attention_2" if flash else "sdpa"
    if packed:
        return "lanes"
    return "eager" if max_sequence_tokens <= EAGER_ATTENTION_MAX_TOKENS else "sdpa"


def liger_installed() -> bool:
    """Whether liger-kernel and Triton can be imported (the `liger` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))


def layer_kernels_choice(name: str, device_type: str) -> str:
    """model.kernels on ``device_type``: auto = torch (Liger's are opt-in until a GPU check has run them); liger needs
    a CUDA device and liger-kernel (a ConfigError naming what is missing)."""
    installed = liger_installed()
    if name == "liger" and (device_type != "cuda" or not installed):
        missing = [f"a CUDA device (this run's: {device_type})"] if device_type != "cuda" else []
        missing += [] if installed else ["liger-kernel (pip install 'reasonrl[liger]')"]
        raise ConfigError(f"model.kernels=liger needs {' and '.join(missing)}; use auto or torch")
    return "torch" if name == "auto" else name


def logprob_head_choice(name: str, device_type: str, entropy_coef: float) -> str:
    """model.logprob_head: auto = chunked; liger needs a CUDA device, liger-kernel and no entropy bonus (Liger's
    fused cross-entropy gives no entropy): a ConfigError naming what is missing otherwise."""
    if name == "liger":
        missing = [f"a CUDA device (this run's: {device_type})"] if device_type != "cuda" else []
        missing += [] if liger_installed() else ["liger-kernel (pip install 'reasonrl[liger]')"]
        if entropy_coef:
            missing.append(f"no entropy bonus (algo.entropy_coef={entropy_coef}: Liger's head computes no entropy)")
        if missing:
            raise ConfigError(f"model.logprob_head=liger needs {' and '.join(missing)}; use auto or chunked")
        return "liger"
    return "chunked"


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` here has native bf16 matmul (a GPU this machine does not see: assumed so).

    Measured on the project's 2-core Xeon (AVX512-BF16), `python bench/dtype.py`: bf16 generates
    1.9× and trains 1.9× faster than fp32 (docs/benchmarks.md); without native bf16 it is slower."""
    import torch

    if device_type == "cuda":
        return not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def forward_dtype_name(cfg: Config, device_type: str) -> str:
    """What forward passes run in on ``device_type``: bfloat16 where the trained weights are stored in it (the
    validator refuses model.dtype=float32 then), else model.dtype, auto = bfloat16 where it is native."""
    if cfg.train.param_dtype == "bfloat16":
        return "bfloat16"
    if cfg.model.dtype != "auto":
        return cfg.model.dtype
    return "bfloat16" if native_bf16(device_type) else "float32"


def vllm_engine_options(cfg: Config) -> dict[str, Any]:
    """The vLLM engine's keyword arguments: rollout.vllm, with max_model_len defaulting to the longest
    prompt + response of the run."""
    options = dataclasses.asdict(cfg.rollout.vllm)
    if options["max_model_len"] is None:
        options["max_model_len"] = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    return options


MICROBATCH_TOKENS = {"cpu": 768, "cuda": 16384}
"""train.microbatch_tokens when it is null, per device type (its docstring says why)."""


def microbatch_token_budget(cfg: Config, device_type: str) -> int:
    """train.microbatch_tokens, or the device's default raised to one full sequence when it is null or auto."""
    if isinstance(cfg.train.microbatch_tokens, int):
        return cfg.train.microbatch_tokens
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    return max(MICROBATCH_TOKENS.get(device_type, MICROBATCH_TOKENS["cpu"]), longest)
