"""The memory plan: a run's peak memory per device, by component, predicted before anything loads.

``plan_memory(cfg, model_config)`` reads the model's transformers config (its shape; the parameters are
counted on the meta device, so no weight is allocated) and the run's settings, and predicts the peak of
the policy update, where a training step peaks:

- runtime: the process itself (Python, torch, transformers; on a GPU allocator slack);
- policy weights, gradients and AdamW's two fp32 moments: ``train.param_dtype`` bytes per parameter for
  the weights, 4 for the trainable parameters' gradients (bf16 weights' are summed in fp32; FSDP2's shards of them
  are bf16), 8 bytes per trainable parameter for AdamW, and 4 more for the fp32 master copy of bf16 weights (none
  of these on the GPU with ``train.offload_optimizer``); LoRA trains only the adapters;
- the frozen reference (with a KL term and no LoRA) in the policy's ``train.param_dtype``, so that it computes as
  the policy does; the critic (gae, egae): its
  weights and AdamW states stay resident while the policy updates (its gradients are freed after its step);
- bf16 weight copies: autocast's bf16 casts of fp32 weights, saved for the backward pass;
- embedding gradient temporaries: a micro-batch's gradients of the input embedding and of the LM head
  ([vocab, d] each) are computed whole before they add to the accumulated ones;
- activations of the largest micro-batch the packing code builds: ``train.microbatch_tokens`` computed tokens in
  every layout (``RolloutBatch.micro_batch_rows`` cuts packed rows so that their lanes' padding stays within the
  budget too), with or without ``model.gradient_checkpointing``, and eager attention's saved probabilities;
- the optimiser step's temporaries, which come after the micro-batches' activations are freed (the peak is the
  larger of the two): none for torch's fused AdamW over fp32 weights; ``MasterWeightAdamW`` on a GPU torch's
  ``foreach`` AdamW's fp32 denominator per weight, and with FSDP2's bf16 shards an fp32 copy of each gradient
  (``OPTIMIZER_STEP_BYTES``);
- on a GPU the caching allocator's headroom: ``ALLOCATOR_HEADROOM`` of the rest (blocks it holds but cannot hand
  out at the peak; an allowance, not measured);
- LM-head chunks: ``DEFAULT_CHUNK_TOKENS`` rows of fp32 logits over the vocabulary and their temporaries;
- the step's sequences (a CPU run's; a GPU run's are checked against the host's memory apart): the completions and
  the RolloutBatch at the caps, ``ROLLOUT_BYTES_PER_TOKEN`` per token;
- the rollout engine's share: on a GPU vLLM takes ``rollout.vllm.gpu_memory_utilization`` of the card
  (with sleep mode it gives it back during the update, so the peak is the larger of generation and
  update), on a CPU its own copy of the weights in the compute dtype (vLLM's CPU build: plus its KV cache);
- with several FSDP2 ranks the weights, gradients, optimiser states, reference and critic are sharded over
  them, and each rank gathers its root unit (embeddings, LM head) and two layers at a time.

The constants not counted (``RUNTIME_CPU_BYTES``, ``ACTIVATION_*``, ``HEAD_COPIES``) were set from the
tensors the code saves and checked against peak RSS on the CPU (``python bench/memory_plan.py``: within 15%
on all four configurations) and against ``max_memory_allocated`` on an H100 (``python bench/memory_plan_gpu.py``:
6 of 14 within 15%, the rest under-predicted by up to 44%: padded micro-batches, long packed lanes,
checkpointed fp32-weight training; docs/benchmarks.md, "Memory plan on an H100").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from reasonrl.config import Config, Plan, resolve
from reasonrl.config.plan import EAGER_ATTENTION_MAX_TOKENS, attended_span, microbatch_token_budget

if TYPE_CHECKING:
    import torch

GIB = 2**30
DEFAULT_CHUNK_TOKENS = 512  # reasonrl.models.logprob_head's (imported by name here: that module loads torch)
ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32
MASTER_BYTES = 4  # the fp32 master copy the optimiser keeps of a weight stored in bf16 (MasterWeightAdamW)
RUNTIME_CPU_BYTES = int(0.55 * GIB)
"""A CPU process's resident memory before any model: Python, torch, transformers and reasonrl imported."""
RUNTIME_CUDA_BYTES = int(0.5 * GIB)
"""Allocator slack, cuBLAS workspaces and collectives' buffers on a GPU (an allowance, not measured here)."""
ACTIVATION_HIDDEN = 12.0
ACTIVATION_INTERMEDIATE = 4.0
"""Values saved for the backward pass per token per layer, in multiples of the hidden size d and the MLP's
intermediate size I (each of the compute dtype's size)."""
ACTIVATION_HIDDEN_AUTOCAST = 24.0
ACTIVATION_INTERMEDIATE_AUTOCAST = 5.0
"""The same under bf16 autocast over fp32 weights (a GPU's default): the residual stream and the RMSNorms
stay fp32 (each norm saves its fp32 input, normalised value and output) and every linear layer saves its own
bf16 cast of its input, so a Qwen2 layer saves about 48·d + 10·I bytes per token. Checked against
``max_memory_allocated`` on an H100 (docs/benchmarks.md, "Memory plan on an H100")."""
ACTIVATION_ATTENTION = 2.0
"""Eager attention: [span, span] score matrices per head saved per layer (probabilities and their softmax)."""
OPTIMIZER_STEP_BYTES = {"cuda": 4, "cpu": 0}
"""Per trained parameter, the temporaries of ``MasterWeightAdamW``'s step on the device: ``foreach`` AdamW's
denominator on a GPU (its other operations are in place; the CPU's fused kernel holds none); the gradient arrives
as the fp32 sum it keeps, except from FSDP2's bf16 shards (``SHARD_GRADIENT_COPY_BYTES`` more)."""
SHARD_GRADIENT_COPY_BYTES = 4
ALLOCATOR_HEADROOM = 0.05
"""On a GPU, the fraction of the planned peak added for memory PyTorch's caching allocator reserves in blocks it
cannot hand out at the peak (an allowance: ``bench/memory_plan_gpu.py`` compares the plan without it with
``max_memory_allocated``)."""
MICROBATCH_AUTO_SMALLEST = 1024
"""train.microbatch_tokens=auto tries one full sequence, then powers of two from this up to a mini-batch's tokens."""
HEAD_COPIES = 4.0
"""LM-head chunk: fp32 [chunk, vocab] tensors alive at once (at most: the logits, their exponential, the GEMM's
bf16 output and the gradient's bf16 cast; models/logprob_head.py)."""
ROLLOUT_BYTES_PER_TOKEN = 128
"""Host memory per token of a step's sequences (prompt + response cap): the completions as Python lists (a token
id and its log-prob, 72 bytes measured with tracemalloc) and the RolloutBatch's [B, P+T] tensors (ids, masks and
up to eight float32 per-token fields, about 51 bytes)."""
FSDP_GATHERED_LAYERS = 2  # the layer running and the one prefetched


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: parameter counts and the text decoder's sizes."""

    parameters: int
    trainable: int
    """Trained parameters: all of them, or with LoRA the adapters."""
    root_parameters: int
    """Parameters outside the decoder layers (embeddings, LM head, final norm): FSDP2's root unit."""
    layer_parameters: int
    """Parameters of one decoder layer."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    key_value_width: int
    """The keys' (and the values') width per token: key/value heads × head size."""
    vocab: int

    @classmethod
    def of(cls, config: Any, lora_rank: int = 0, lora_targets: str | tuple[str, ...] = "all-linear") -> ModelShape:
        """Count ``config``'s parameters on the meta device (nothing allocated) and LoRA's adapters on them; once per
        config and LoRA setting in a process (a plan of train.microbatch_tokens=auto weighs many budgets)."""
        key = (config.to_json_string(use_diff=False), lora_rank, lora_targets)
        if key not in _SHAPES:
            if len(_SHAPES) >= SHAPES_KEPT:
                _SHAPES.clear()
            _SHAPES[key] = cls.counted(config, lora_rank, lora_targets)
        return _SHAPES[key]

    @classmethod
    def counted(cls, config: Any, lora_rank: int, lora_targets: str | tuple[str, ...]) -> ModelShape:
        """``of``'s count, made on the meta device."""
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto.from_config(config)
        text = config.get_text_config()
        parameters = sum(p.numel() for p in model.parameters())
        layer = max(sum(p.numel() for p in m.parameters()) for m in decoder_layers(model))
        return cls(
            parameters=parameters,
            trainable=lora_parameters(model, lora_rank, lora_targets) if lora_rank else parameters,
            root_parameters=parameters - layer * text.num_hidden_layers,
            layer_parameters=layer,
            layers=text.num_hidden_layers,
            hidden=text.hidden_size,
            intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
            heads=text.num_attention_heads,
            key_value_width=(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
            * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
            vocab=text.vocab_size,
        )


SHAPES_KEPT = 16
_SHAPES: dict[tuple, ModelShape] = {}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's layers: the longest ModuleList of the model (a VLM's text decoder, not its vision tower)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


def lora_parameters(model: torch.nn.Module, rank: int, targets: str | tuple[str, ...]) -> int:
    """Adapter parameters r·(in + out) of every targeted linear layer (all-linear: all but the LM head)."""
    import torch

    head = model.get_output_embeddings()
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets:
            count += rank * (module.in_features + module.out_features)
    return count


@dataclass(frozen=True)
class MemoryPlan:
    """Predicted peak bytes per device, by component, and what the device has."""

    device_type: str
    world_size: int
    parameters: int
    components: dict[str, int]
    """Component -> bytes per device at the update's peak (the rollout engine's share included)."""
    total: int
    """Predicted peak per device: the components' sum, or with a sleeping vLLM the larger of generation
    (resident parts + the engine's share) and the update (everything else)."""
    microbatch_tokens: int
    """The token budget planned for (train.microbatch_tokens, auto resolved)."""
    capacity: int | None = None
    """Bytes the device has for this process (free GPU memory, or available RAM per local rank); None = unknown."""
    notes: tuple[str, ...] = field(default=())
    gradient_checkpointing: bool = False
    """Whether the plan recomputes activations (model.gradient_checkpointing, auto resolved)."""

    @property
    def fits(self) -> bool:
        """Whether the total fits the capacity (an unknown capacity fits)."""
        return self.capacity is None or self.total <= self.capacity

    def table(self) -> str:
        """component | GiB per device, the total and the capacity, as lines of text."""
        rows = [(name, value) for name, value in self.components.items() if value]
        width = max(len(name) for name, _ in [*rows, ("total (predicted peak)", 0)])
        lines = [f"{'component':<{width}}  GiB per device", *(f"{n:<{width}}  {gib(v):>8.2f}" for n, v in rows)]
        lines.append(f"{'total (predicted peak)':<{width}}  {gib(self.total):>8.2f}")
        capacity = "unknown" if self.capacity is None else f"{gib(self.capacity):>8.2f}"
        lines.append(f"{f'{self.device_type} available':<{width}}  {capacity}")
        return "\n".join([*lines, *self.notes])


def gib(value: float) -> float:
    return value / GIB


def element_size(dtype_name: str) -> int:
    """Bytes of one value of a dtype named float32 or bfloat16."""
    return 2 if dtype_name == "bfloat16" else 4


def plan_memory(
    cfg: Config,
    model_config: Any,
    *,
    device_type: str,
    world_size: int = 1,
    capacity: int | None = None,
    device_memory: int | None = None,
) -> MemoryPlan:
    """The peak memory per device of ``cfg``'s training on ``device_type`` ("cpu" or "cuda") with
    ``world_size`` FSDP2 ranks; ``device_memory`` is the GPU's total (vLLM's share is a fraction of it).
    model.gradient_checkpointing=auto plans without it, and with it where that does not fit ``capacity``;
    train.microbatch_tokens=auto plans the largest budget that fits (``auto_microbatch_plan``)."""
    options = dict(device_type=device_type, world_size=world_size, capacity=capacity, device_memory=device_memory)
    if cfg.train.microbatch_tokens == "auto":
        return auto_microbatch_plan(cfg, model_config, options)
    if cfg.model.gradient_checkpointing == "auto":
        return auto_checkpointing_plan(cfg, model_config, options)
    m, t = cfg.model, cfg.train
    plan = resolve(cfg, device_type, world_size)
    shape = ModelShape.of(model_config, m.lora_rank, m.lora_target_modules)
    param_bytes = element_size(t.param_dtype)
    compute = plan.forward_dtype
    compute_bytes = element_size(compute)
    # LoRA's adapters stay fp32; bf16 weights' gradients are summed in fp32 (MasterWeightAdamW: on the host where it
    # offloads), but FSDP2's shards of them are in the weights' dtype (FSDP2 sums micro-batches in fp32 unsharded)
    gradient_bytes = 4 if m.lora_rank or plan.world_size == 1 else param_bytes
    master = param_bytes != 4 and not m.lora_rank  # bf16 weights: an fp32 master beside the moments
    optimizer_bytes = ADAM_BYTES + (MASTER_BYTES if master else 0)
    offload = t.offload_optimizer and device_type == "cuda"
    shards = max(1, plan.world_size)
    host_shards = offload and shards > 1  # FSDP2's CPUOffloadPolicy: the weights' and gradients' shards too
    tokens = plan.microbatch_tokens
    autocast = compute == "bfloat16" and param_bytes == 4
    activations = activation_bytes(cfg, plan, shape, autocast)
    separate_reference = plan.uses_reference and not m.lora_rank  # LoRA: the frozen base is the reference
    casts = 2 * shape.parameters if autocast and not m.gradient_checkpointing else 0
    components = {
        "runtime": RUNTIME_CUDA_BYTES if device_type == "cuda" else RUNTIME_CPU_BYTES,
        "policy weights": 0 if host_shards else shape.parameters * param_bytes // shards,
        "policy gradients": 0 if host_shards or (master and offload) else shape.trainable * gradient_bytes // shards,
        "optimizer states (AdamW)": 0 if offload else shape.trainable * optimizer_bytes // shards,
        "reference weights": shape.parameters * param_bytes // shards if separate_reference else 0,
        "critic (weights, AdamW)": (
            (shape.parameters * param_bytes + shape.trainable * (0 if offload else optimizer_bytes)) // shards
            if plan.uses_critic
            else 0
        ),
        "FSDP2 gathered layers": (
            (shape.root_parameters + FSDP_GATHERED_LAYERS * shape.layer_parameters) * param_bytes if shards > 1 else 0
        ),
        "bf16 weight copies": casts // shards,
        "embedding gradient temporaries": 0 if m.lora_rank else 2 * shape.vocab * shape.hidden * gradient_bytes,
        "activations": activations,
        "LM-head chunks": int(HEAD_COPIES * 4 * min(DEFAULT_CHUNK_TOKENS, tokens) * shape.vocab),
        "optimizer step temporaries": (
            shape.trainable * (OPTIMIZER_STEP_BYTES[device_type] + SHARD_GRADIENT_COPY_BYTES * (shards > 1)) // shards
            if master and not offload
            else 0
        ),
        "rollout engine": engine_bytes(cfg, device_type, shape, compute_bytes, device_memory),
        "rollout batch (host)": rollout_batch_bytes(cfg) if device_type == "cpu" else 0,
    }
    total, notes = planned_peak(components, engine_sleeps(cfg, device_type), device_type)
    return MemoryPlan(device_type, shards, shape.parameters, components, total, tokens, capacity, notes,
                      m.gradient_checkpointing)  # fmt: skip


def activation_bytes(cfg: Config, plan: Plan, shape: ModelShape, autocast: bool) -> int:
    """What the largest micro-batch (``plan.microbatch_tokens`` computed tokens) keeps for its backward pass: each
    layer's saved values, or with gradient checkpointing each layer's input (and with the selective policy its
    matmuls' and attention's outputs) plus one layer recomputed at a time, and eager attention's score matrices."""
    tokens, compute_bytes = plan.microbatch_tokens, element_size(plan.forward_dtype)
    # a packed lane or a padded row: the longest row's length, or a segment of rows sharing a prompt
    span = min(tokens, attended_span(cfg, plan.device_type, plan.max_sequence_tokens))
    hidden_factor, intermediate_factor = (
        (ACTIVATION_HIDDEN_AUTOCAST, ACTIVATION_INTERMEDIATE_AUTOCAST)
        if autocast
        else (ACTIVATION_HIDDEN, ACTIVATION_INTERMEDIATE)
    )
    per_layer = compute_bytes * (hidden_factor * shape.hidden + intermediate_factor * shape.intermediate)
    # eager saves two [span, span] matrices per head, lanes' eager one (varlen_attention._eager_lanes), SDPA none
    lanes_eager = plan.attention == "lanes" and span <= EAGER_ATTENTION_MAX_TOKENS
    matrices = ACTIVATION_ATTENTION if plan.attention == "eager" else 1.0 if lanes_eager else 0.0
    attention = matrices * compute_bytes * shape.heads * span * tokens
    if not cfg.model.gradient_checkpointing:
        return int(tokens * shape.layers * per_layer + attention * shape.layers)
    kept = 4 * shape.hidden  # each layer's input (the fp32 residual)
    selective = cfg.model.checkpoint_policy == "selective"  # eager's score matrices are matmul outputs: kept too
    if selective:
        kept += compute_bytes * (4 * shape.hidden + 2 * shape.key_value_width + 2 * shape.intermediate)
    return int(tokens * (shape.layers * kept + per_layer) + attention * (shape.layers if selective else 1))


UPDATE_TRANSIENTS = (
    "FSDP2 gathered layers",
    "bf16 weight copies",
    "embedding gradient temporaries",
    "activations",
    "LM-head chunks",
)
"""Components alive only while a micro-batch's forward and backward run."""


def planned_peak(components: dict[str, int], sleeping_engine: bool, device_type: str) -> tuple[int, tuple[str, ...]]:
    """The peak of ``components`` (adding the allocator's headroom to them on a GPU) and notes on how it was summed:
    what stays resident, plus the larger of a micro-batch's transients and the optimiser step's temporaries; with
    a sleeping vLLM the larger of generation (no gradients, no transients) and the update (no engine)."""
    update = sum(components[name] for name in UPDATE_TRANSIENTS)
    step = components["optimizer step temporaries"]
    resident = sum(components.values()) - update - step
    total = resident + max(update, step)
    notes = []
    if step > update:
        notes.append("the optimiser step's temporaries exceed a micro-batch's: the peak is at the step")
    if sleeping_engine:
        total = max(resident - components["policy gradients"], total - components["rollout engine"])
        notes.append("vLLM sleeps during the update: the total is the larger of generation and update")
    if device_type == "cuda":
        components["allocator headroom"] = int(ALLOCATOR_HEADROOM * total)
        total += components["allocator headroom"]
    return total, tuple(notes)


def auto_checkpointing_plan(cfg: Config, model_config: Any, options: dict) -> MemoryPlan:
    """``plan_memory``'s plan of model.gradient_checkpointing=auto: without recomputation where that fits the
    capacity in ``options`` (or it is unknown), else with it, saying why."""
    without = plan_memory(with_setting(cfg, "model.gradient_checkpointing", False), model_config, **options)
    if without.fits:
        return without
    with_it = plan_memory(with_setting(cfg, "model.gradient_checkpointing", True), model_config, **options)
    note = (f"model.gradient_checkpointing=auto: on (without it the peak would be {gib(without.total):.2f} GiB, "
            f"more than the {gib(options['capacity'] or 0):.2f} GiB available)")  # fmt: skip
    return replace(with_it, notes=(*with_it.notes, note))


def microbatch_candidates(cfg: Config, device_type: str) -> list[int]:
    """The budgets train.microbatch_tokens=auto chooses from, smallest first: on a GPU one full sequence, then powers
    of two from ``MICROBATCH_AUTO_SMALLEST`` up to a mini-batch's tokens at the caps (a larger budget never fills);
    on the CPU the device's default alone (its memory is the machine's, shared with the rollout and everything
    else, and a larger micro-batch computes no faster there: docs/benchmarks.md)."""
    default = microbatch_token_budget(cfg, device_type)
    if device_type != "cuda":
        return [default]
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    most = cfg.train.minibatch_sequences * longest
    powers = [MICROBATCH_AUTO_SMALLEST * 2**k for k in range(32) if MICROBATCH_AUTO_SMALLEST * 2**k <= most]
    return [longest, *(b for b in powers if b > longest)]


def auto_microbatch_plan(cfg: Config, model_config: Any, options: dict) -> MemoryPlan:
    """``plan_memory``'s plan of train.microbatch_tokens=auto: the largest of ``microbatch_candidates`` whose plan
    fits the capacity in ``options`` (unknown: the device's default).  With model.gradient_checkpointing=auto,
    without recomputation where the device's default budget or a larger one fits without it, else with it at
    the largest budget that fits then.  Where none fits, the smallest budget (the check then refuses the run,
    naming the settings that would fit)."""
    device_type, capacity = options["device_type"], options["capacity"]
    default = microbatch_token_budget(cfg, device_type)
    if capacity is None:
        return plan_memory(with_setting(cfg, "train.microbatch_tokens", default), model_config, **options)
    auto = cfg.model.gradient_checkpointing == "auto"
    candidates = microbatch_candidates(cfg, device_type)
    for checkpointing in [False, True] if auto else [cfg.model.gradient_checkpointing]:
        setting = with_setting(cfg, "model.gradient_checkpointing", checkpointing)
        plans = [plan_memory(with_setting(setting, "train.microbatch_tokens", b), model_config, **options)
                 for b in candidates]  # fmt: skip
        fitting = [p for p in plans if p.fits]
        if fitting and (checkpointing or not auto or fitting[-1].microbatch_tokens >= min(default, candidates[-1])):
            chosen = fitting[-1]
            note = (f"train.microbatch_tokens=auto: {chosen.microbatch_tokens} tokens, the largest of "
                    f"{candidates[0]}–{candidates[-1]} that fits ({gib(chosen.total):.2f} of {gib(capacity):.2f} "
                    f"GiB predicted), gradient checkpointing {'on' if checkpointing else 'off'}")  # fmt: skip
            turned_on = ("model.gradient_checkpointing=auto: on (no budget of at least "
                         f"{default} tokens fits without it)",) if auto and checkpointing else ()  # fmt: skip
            return replace(chosen, notes=(*chosen.notes, note, *turned_on))
    return plans[0]


def rollout_batch_bytes(cfg: Config) -> int:
    """Host memory of one step's sequences at their caps: the batch's rows and one more generation pass (dynamic
    sampling keeps groups from several passes before it trims to the batch)."""
    plan, r = resolve(cfg), cfg.rollout
    rows = plan.sequences_per_rollout + plan.prompts_per_generation_pass * r.samples_per_prompt
    return rows * (r.max_prompt_tokens + r.max_response_tokens) * ROLLOUT_BYTES_PER_TOKEN


def engine_name(cfg: Config, device_type: str) -> str:
    """rollout.engine as build_engine resolves auto (vllm on a GPU where installed)."""
    import importlib.util

    if cfg.rollout.engine != "auto":
        return cfg.rollout.engine
    if device_type == "cuda":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    return "fast"


def engine_sleeps(cfg: Config, device_type: str) -> bool:
    """vLLM on a GPU with sleep mode: its share is free during the update."""
    return device_type == "cuda" and engine_name(cfg, device_type) == "vllm" and cfg.rollout.vllm.sleep_mode


def engine_bytes(
    cfg: Config, device_type: str, shape: ModelShape, compute_bytes: int, device_memory: int | None
) -> int:
    """The rollout engine's memory on the trainer's device: vLLM's share of a GPU, else its weights' copy."""
    name = engine_name(cfg, device_type)
    if name == "vllm" and device_type == "cuda":
        return int(cfg.rollout.vllm.gpu_memory_utilization * (device_memory or 0))
    copy = shape.parameters * compute_bytes
    return copy + cfg.rollout.vllm.cpu_kv_cache_gib * GIB if name == "vllm" else copy


def with_setting(cfg: Config, key: str, value: Any) -> Config:
    """``cfg`` with one dotted setting (group.name) changed."""
    group, name = key.split(".")
    return replace(cfg, **{group: replace(getattr(cfg, group), **{name: value})})
