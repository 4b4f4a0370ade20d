"""The memory check before a run loads anything: the plan of ``models.memory_plan`` against what the device has,
and where it does not fit, one error naming the settings that would (each with its predicted peak).

``train.memory_check`` decides: refuse (the default), warn, or skip; ``reasonrl config show`` prints the same plan.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.config import Config, ConfigError
from reasonrl.config.plan import planned_device_type, planned_world_size
from reasonrl.models.memory_plan import (
    ROLLOUT_BYTES_PER_TOKEN,
    MemoryPlan,
    gib,
    plan_memory,
    rollout_batch_bytes,
    with_setting,
)

if TYPE_CHECKING:
    import torch

LORA_RANK_SUGGESTED = 16
GPU_COUNTS = (2, 4, 8, 16, 32, 64)


def device_memory(device: torch.device, local_ranks: int = 1) -> tuple[int, int]:
    """(bytes available to this process, the device's total): a GPU's free and total memory, or the
    machine's (``host_memory``) shared by ``local_ranks`` processes."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free, total
    return host_memory(local_ranks)


def host_memory(local_ranks: int = 1) -> tuple[int, int]:
    """(the machine's available RAM, /proc/meminfo's MemAvailable, per ``local_ranks`` processes; its total)."""
    lines = Path("/proc/meminfo").read_text().splitlines()
    info = dict(line.split(":", 1) for line in lines if ":" in line)
    available, total = (int(info[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal"))
    return available // max(1, local_ranks), total


def fixing_settings(cfg: Config, model_config: Any, plan: MemoryPlan) -> list[tuple[str, MemoryPlan]]:
    """Each setting that lowers ``plan``'s peak, with the plan it would give: the largest
    train.microbatch_tokens that fits (or its smallest, one full sequence), gradient checkpointing, LoRA,
    optimiser offload (GPU), bf16 parameters, and on a GPU the fewest FSDP2 ranks that fit."""
    options = dict(device_type=plan.device_type, world_size=plan.world_size, capacity=plan.capacity)
    m, t = cfg.model, cfg.train
    changes: list[tuple[str, Any]] = []
    budget = plan.microbatch_tokens  # with auto: what it planned
    smallest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    budgets = [budget // 2**k for k in range(1, 12) if budget // 2**k > smallest] + [smallest]
    fitting = [b for b in budgets if b < budget and plan_memory(with_setting(cfg, "train.microbatch_tokens", b),
                                                                 model_config, **options).fits]  # fmt: skip
    if fitting or smallest < budget:
        changes.append(("train.microbatch_tokens", fitting[0] if fitting else smallest))
    if not m.gradient_checkpointing:
        changes.append(("model.gradient_checkpointing", True))
    if not m.lora_rank:
        changes.append(("model.lora_rank", LORA_RANK_SUGGESTED))
    if plan.device_type == "cuda" and not t.offload_optimizer:
        changes.append(("train.offload_optimizer", True))
    if t.param_dtype == "float32" and m.dtype != "float32":  # bf16 weights need bf16 passes
        changes.append(("train.param_dtype", "bfloat16"))
    found = [(f"{key}={str(value).lower()}", plan_memory(with_setting(cfg, key, value), model_config, **options))
             for key, value in changes]  # fmt: skip
    if plan.device_type == "cuda":
        for ranks in (n for n in GPU_COUNTS if n > plan.world_size):
            more = plan_memory(cfg, model_config, **(options | {"world_size": ranks}))
            if more.fits or ranks == GPU_COUNTS[-1]:
                launch = f"torchrun --nproc-per-node {ranks}, or dist.trainer_workers={ranks}"
                found.append((f"{ranks} GPUs ({launch})", more))
                break
    return found


def refusal_message(cfg: Config, model_config: Any, plan: MemoryPlan) -> str:
    """Why the run does not fit, its plan, and the settings that would make it fit with their predicted peaks."""
    fixes = fixing_settings(cfg, model_config, plan)
    fit = [f"{setting} ({gib(p.total):.2f} GiB)" for setting, p in fixes if p.fits]
    short = [f"{setting} ({gib(p.total):.2f} GiB)" for setting, p in fixes if not p.fits]
    lines = [
        f"the memory plan predicts a peak of {gib(plan.total):.2f} GiB per device for training "
        f"{cfg.model.name_or_path}, more than the {gib(plan.capacity or 0):.2f} GiB this {plan.device_type} has "
        "available (nothing has loaded yet):",
        *(f"  {line}" for line in plan.table().splitlines()),
        f"settings that would make it fit (predicted peak per device): {'; '.join(fit) or 'none alone'}",
    ]
    if short:
        lines.append(f"settings that lower it but not enough alone: {'; '.join(short)}")
    sequences = plan.components.get("rollout batch (host)", 0)
    if sequences > plan.total / 2:  # the step's sequences, which none of those settings shrink
        lines.append(
            f"a rollout step's sequences alone take {gib(sequences):.2f} GiB: lower rollout.rollout_prompts, "
            "rollout.samples_per_prompt or rollout.max_response_tokens"
        )
    lines.append("to run it anyway: train.memory_check=warn (or skip)")
    return "\n".join(lines)


def memory_plan_of(cfg: Config, device: torch.device | None = None, world_size: int | None = None) -> MemoryPlan | str:
    """The plan of ``cfg`` on ``device`` (default: the run's device on this machine) with ``world_size``
    ranks (default: the run's), with what the device has here; or a line saying why there is none (the
    model's config is not on this machine)."""
    import torch

    from reasonrl.models.load import model_config
    from reasonrl.models.model_error import ModelError

    device = device or torch.device(planned_device_type(cfg))
    try:
        config = model_config(cfg.model.name_or_path)
    except ModelError as exc:
        return f"no memory plan: {exc}"
    if config is None:
        return f"no memory plan: the config of {cfg.model.name_or_path} is not on this machine (nothing is downloaded)"
    here = device.type == "cpu" or torch.cuda.is_available()
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available, total = device_memory(device, local_ranks) if here else (None, None)
    return plan_memory(
        cfg,
        config,
        device_type=device.type,
        world_size=world_size or planned_world_size(cfg),
        capacity=available,
        device_memory=total,
    )


def check_memory(cfg: Config, device: torch.device, world_size: int = 1) -> MemoryPlan | None:
    """Refuse a run whose plan exceeds what ``device`` has (a ConfigError naming the settings that would
    fit), before any weight loads; train.memory_check=warn logs that instead, skip skips the check."""

    mode = cfg.train.memory_check
    if mode == "skip":
        return None
    log = logging.getLogger(__name__)
    if device.type != "cpu":  # a GPU run's sequences live in host memory: the device plan does not hold them
        host = rollout_batch_bytes(cfg)
        available = host_memory(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))[0]
        if host > available:
            message = (
                f"a rollout step's sequences take about {gib(host):.2f} GiB of host memory (rollout.rollout_prompts × "
                f"rollout.samples_per_prompt × (rollout.max_prompt_tokens + rollout.max_response_tokens) tokens at "
                f"{ROLLOUT_BYTES_PER_TOKEN} bytes each), more than the {gib(available):.2f} GiB this machine has "
                "available: lower one of them; to run it anyway: train.memory_check=warn (or skip)"
            )
            if mode == "refuse":
                raise ConfigError(message)
            log.warning("%s", message)
    plan = memory_plan_of(cfg, device, world_size)
    if isinstance(plan, str):
        log.warning("%s; the run starts unchecked", plan)
        return None
    if not plan.fits:
        from reasonrl.models.load import model_config

        message = refusal_message(cfg, model_config(cfg.model.name_or_path), plan)
        if mode == "refuse":
            raise ConfigError(message)
        log.warning("%s", message)
    return plan
