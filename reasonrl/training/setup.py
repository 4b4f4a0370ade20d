"""Setting a run up: the policy, its engine, the reference, the critic, the scorer and the data, as one
``Run``, each placed by the training backend (``reasonrl.training.backend``: one process, or one FSDP2 rank)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasonrl.algo.kl import AdaptiveKLController, FixedKLController
from reasonrl.config import Config, Plan, resolve
from reasonrl.config.plan import vllm_engine_options
from reasonrl.config.validate import RunFacts, refuse_not_run_together
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.models.checkpointing import enable_checkpointing
from reasonrl.models.embedding_gradient import sum_embedding_gradients_in_fp32
from reasonrl.models.forward import packing_refusal, prompt_sharing_refusal
from reasonrl.models.liger_kernels import liger_refusal, use_liger_layer_kernels
from reasonrl.models.load import ModelError, load_model, load_tokenizer, resolve_device, vision_processor
from reasonrl.models.lora import add_lora
from reasonrl.models.memory_check import check_memory
from reasonrl.models.memory_plan import MemoryPlan, engine_name
from reasonrl.models.optim import adamw, trainable_parameters
from reasonrl.models.value import load_value_model, rescale_head, value_model_from_policy
from reasonrl.reward.prm import ProcessRewardModel
from reasonrl.reward.verifier_protocol import Scorer, Verifier
from reasonrl.rollout import RolloutEngine, build_engine
from reasonrl.rollout.tppo_pool import RolloutPool
from reasonrl.training.backend import SingleProcess, TrainedModels, TrainingBackend
from reasonrl.training.placement.cpu_threads import apply_threads
from reasonrl.training.placement.parallel import DataParallel, RemoteWorkers
from reasonrl.training.record.run_health import RunHealth
from reasonrl.training.record.sample_log import SampleLog
from reasonrl.training.record.trackers import Tracker
from reasonrl.training.rollout_setup import asynchronous_rollouts, training_rollouts
from reasonrl.training.rollouts.conversation_stage import (
    ConversationCollector,
)
from reasonrl.training.rollouts.process_rewards import ProcessRewards
from reasonrl.training.rollouts.rollout_stage import RolloutCollector, RolloutSettings, RolloutStage
from reasonrl.training.run_inputs import (
    build_scorer,
    check_prompts,
    checked_encoder,
    data_spec,
    preflight,
    prompt_encoder,
)
from reasonrl.training.update.critic import CriticUpdater
from reasonrl.training.update.offline_batches import OfflineData
from reasonrl.training.update.policy import TokenLogprobs
from reasonrl.training.update.step import PolicyUpdater, RolloutCorrection

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RunOutputs:
    """Where a run writes: its directory (checkpoints, the export, metrics), the trackers, the sample log."""

    run_dir: Path
    saved_tokenizer: Any
    """What a checkpoint and the exported model save beside the weights: a vision-language model's processor
    (its tokenizer, image processor and chat template), else the tokenizer."""
    trackers: list[Tracker] = field(default_factory=list)
    """The experiment trackers of run.loggers, shared by the metrics streams (opened by ``fit``, rank 0)."""
    sample_log: SampleLog | None = None
    """Where a few samples of each step go as text (run.log_samples; rank 0 only, opened by ``fit``)."""


@dataclass(kw_only=True)
class HeldOutEvaluation:
    """What the held-out evaluation answers with, beside the run's engine and tokenizer."""

    scorer: Scorer
    """What scores the responses (the reward router, a user's verifier, weighted reward functions); the
    training rollouts' scorer too, closed with the run."""
    encoder: PromptEncoder
    episodes: ConversationCollector | None = None
    """What the evaluation plays in an environment run (rollout.multiturn tool or env): the training rollouts'
    environment, built once with the run; None: the evaluation answers each prompt in one turn."""


@dataclass(kw_only=True)
class Run:
    """Everything a run holds while it trains."""

    cfg: Config
    plan: Plan
    outputs: RunOutputs
    backend: TrainingBackend
    """Where the trained models live (one process, or one FSDP2 rank): checkpoints and weight syncs go through it."""
    model: torch.nn.Module
    tokenizer: Any
    engine: RolloutEngine
    reference: TokenLogprobs | None
    """The frozen KL reference (None without a KL term, and with LoRA: then the policy's base is the reference)."""
    evaluation: HeldOutEvaluation
    collector: RolloutCollector
    """Synchronous single-turn rollouts (value pretraining always uses them)."""
    rollout: RolloutStage
    """The training rollouts' stage: ``collector``, T-PPO's truncated rollouts (algo.window_tokens),
    multi-turn conversations (rollout.multiturn) or the asynchronous producer's (rollout.max_staleness)."""
    updater: PolicyUpdater
    kl: FixedKLController | AdaptiveKLController
    critic: CriticUpdater | None
    offline: OfflineData | None = None
    """The offline dataset of algo.offline (dpo, dqo); None = online RL."""
    health: RunHealth = field(default_factory=lambda: RunHealth("engine", 0))
    """The checks that stop a run training on nothing or on weights other than its own (``run_health``)."""

    def close(self) -> None:
        """Stop what the run started beside this process: the rollout producer, the scoring workers."""
        self.rollout.close()
        self.evaluation.scorer.close()

    @property
    def parallel(self) -> DataParallel:
        """The data-parallel group the backend trains in: this rank's rows of each forward pass, sums of metrics."""
        return self.backend.parallel

    @property
    def trained(self) -> TrainedModels:
        """The policy and critic with their optimisers, as the backend checkpoints them."""
        return TrainedModels(self.updater, self.critic)


def build_critic(
    cfg: Config, plan: Plan, device: torch.device, backend: TrainingBackend | None = None
) -> CriticUpdater:
    """The value model (from the policy's weights, a saved critic or a reward model) on ``device``, placed
    by ``backend`` (default: this process), and its optimiser."""
    backend = backend or SingleProcess()
    attention, dtype = plan.attention, plan.forward_torch_dtype
    if cfg.critic.init == "policy":
        model = value_model_from_policy(cfg.model.name_or_path, attention, device)
    elif cfg.critic.init == "prm":  # the PRM's success probability, on the reward scale (arXiv 2410.17621)
        low, high = cfg.reward.incorrect_score, cfg.reward.correct_score
        model = rescale_head(load_value_model(cfg.critic.path or cfg.reward.prm_path, attention), high - low, low)
        model = model.to(device)
    else:
        model = load_value_model(cfg.critic.path, attention).to(device)
    model.backbone.to(plan.parameter_torch_dtype)  # the d -> 1 head stays fp32 (ValueModel.forward)
    if plan.world_size > 1:  # but FSDP2 shards its root unit (with the head) in one dtype
        model.head.to(plan.parameter_torch_dtype)
    sum_embedding_gradients_in_fp32(model.backbone)
    with_layer_kernels(plan, model.backbone)
    if plan.gradient_checkpointing:
        enable_checkpointing(model.backbone, cfg.model.checkpoint_policy)
    add_lora(model.backbone, cfg.model)  # with LoRA the head still trains fully
    backend.place(model, dtype, cfg.train.offload_optimizer)
    optimizer = adamw(trainable_parameters(model), plan.critic_lr, cfg.train.weight_decay, cfg.train.offload_optimizer)
    return CriticUpdater(
        model,
        optimizer,
        value_clip=cfg.algo.value_clip,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=plan.microbatch_tokens,
        grad_clip=cfg.train.grad_clip,
        compute_dtype=dtype,
        parallel=backend.parallel,
        packed=packs_sequences(cfg, model.backbone.config, "critic"),
        share_prompts=shares_prompts(cfg, model.backbone.config, plan.device_type, "critic"),
    )


def build_policy_updater(cfg: Config, plan: Plan, policy: TokenLogprobs, backend: TrainingBackend) -> PolicyUpdater:
    """The policy's optimiser (over its trainable weights, as ``backend`` placed them; its moments in CPU
    memory with train.offload_optimizer), its warm-up schedule, and the update of ``cfg.algo``."""
    t = cfg.train
    optimizer = adamw(trainable_parameters(policy.model), t.lr, t.weight_decay, t.offload_optimizer)
    warmup = plan.warmup_optimizer_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    return PolicyUpdater(
        policy,
        optimizer,
        scheduler,
        cfg.algo,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=plan.microbatch_tokens,
        grad_clip=cfg.train.grad_clip,
        loss_agg_constant=plan.loss_agg_constant,
        parallel=backend.parallel,
        correction=RolloutCorrection(
            plan.rollout_correction, cfg.algo.rollout_correction_level, plan.rollout_correction_threshold
        ),
    )


def packs_sequences(cfg: Config, model_config: Any, role: str) -> bool:
    """train.pack_sequences as a model of ``model_config`` can honour it: an architecture whose packed
    forward is not verified (``models.forward.packing_refusal``) runs padded, said once per ``role``."""
    refusal = packing_refusal(model_config) if cfg.train.pack_sequences else None
    if refusal is not None:
        log.warning("train.pack_sequences: the %s: %s", role, refusal)
    return cfg.train.pack_sequences and refusal is None


def shares_prompts(cfg: Config, model_config: Any, device_type: str, role: str) -> bool:
    """train.share_prompts as a model of ``model_config`` on ``device_type`` can honour it (packed sequences, and
    ``models.forward.prompt_sharing_refusal`` says nothing): otherwise each row reads its own prompt, said once
    per ``role`` where the run asked for sharing on the CPU."""
    if not (cfg.train.share_prompts and cfg.train.pack_sequences):
        return False
    refusal = prompt_sharing_refusal(model_config, device_type)
    if refusal is not None and device_type == "cpu":
        log.info("train.share_prompts: the %s: %s; each row reads its own prompt", role, refusal)
    return refusal is None


def with_planned_settings(cfg: Config, plan: Plan, memory: MemoryPlan | None, parallel: DataParallel) -> Plan:
    """``plan`` with the memory plan's choices (``memory``; said in the log): model.gradient_checkpointing=auto on
    where it needed recomputation to fit, on every rank if one rank's plan did; train.microbatch_tokens=auto its
    budget, the smallest of the ranks' (a plan-less run keeps the device's default)."""
    if cfg.train.microbatch_tokens == "auto":  # every rank takes part in the agreement, with a plan or without
        planned = memory.microbatch_tokens if memory is not None else None
        budget = -parallel.max(-(planned or plan.microbatch_tokens))
        said = [n for n in memory.notes if n.startswith("train.microbatch_tokens=auto")] if planned else []
        why = said[0] if said else "no memory plan here: the device's default"
        log.info("train.microbatch_tokens=auto: %d tokens, the smallest over ranks (this rank's plan: %s)", budget, why)
        plan = replace(plan, microbatch_tokens=budget)
    needed = memory is not None and memory.gradient_checkpointing
    if cfg.model.gradient_checkpointing != "auto" or not parallel.max(int(needed)):
        return plan
    said = [n for n in memory.notes if n.startswith("model.gradient_checkpointing=auto")] if needed else []
    log.info("%s", said[0] if said else "model.gradient_checkpointing=auto: on (another rank needs it)")
    return replace(plan, gradient_checkpointing=True)


def with_layer_kernels(plan: Plan, model: torch.nn.Module) -> None:
    """Liger's RMSNorm, RoPE and SwiGLU kernels in ``model`` where the plan chose them (``models.liger_kernels``); a
    model Liger does not cover is refused, naming why."""
    if plan.layer_kernels != "liger":
        return
    refusal = liger_refusal(model.config)
    if refusal:
        raise ModelError(f"model.kernels=liger: {refusal}; use auto or torch")
    use_liger_layer_kernels(model)


def kl_controller(cfg: Config) -> FixedKLController | AdaptiveKLController:
    """The KL coefficient's controller: fixed, or adaptive toward algo.kl_target (Ziegler et al. 2019)."""
    a = cfg.algo
    if a.kl_controller == "adaptive":
        return AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon)
    return FixedKLController(a.kl_coef)


def load_policy(
    cfg: Config,
    plan: Plan,
    device: torch.device,
    tokenizer,
    engine: RolloutEngine | None,
    workers: RemoteWorkers | None,
    backend: TrainingBackend,
) -> tuple[torch.nn.Module, RolloutEngine, TokenLogprobs, TokenLogprobs | None]:
    """The policy model (fp32 master weights, or bf16) and its log-probs, its engine (``engine`` given, the remote
    workers', or built on the plain weights before LoRA's adapters are added) and the frozen reference where the
    run has one (a KL term without LoRA), placed by ``backend``."""
    attention, dtype, parameters = plan.attention, plan.forward_torch_dtype, plan.parameter_torch_dtype
    model = load_model(cfg.model.name_or_path, parameters, attention, device)  # fp32 master weights, or bf16
    sum_embedding_gradients_in_fp32(model)
    with_layer_kernels(plan, model)
    if plan.gradient_checkpointing:
        enable_checkpointing(model, cfg.model.checkpoint_policy)
    if workers is not None:
        engine = workers.engine
    elif engine is None:
        engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
    engine = backend.share_engine(engine)
    add_lora(model, cfg.model)  # after the engine took the plain weights (a fresh adapter changes nothing)
    packed = packs_sequences(cfg, model.config, "policy")
    share_prompts = packed and shares_prompts(cfg, model.config, plan.device_type, "policy")
    policy = TokenLogprobs(model, cfg.rollout.temperature, dtype, packed, share_prompts, plan.logprob_head)
    separate_reference = plan.uses_reference and not cfg.model.lora_rank  # LoRA: the frozen base is the reference
    reference = None
    if separate_reference:
        # the reference computes as the policy does (its weights' dtype, the same autocast and packing): at
        # identical weights the two log-probs of a row are equal to the bit, and the KL's gradient is 0
        frozen = load_model(cfg.model.name_or_path, parameters, attention, device)
        with_layer_kernels(plan, frozen)
        shape = (policy.packed, policy.share_prompts, policy.logprob_head)
        reference = TokenLogprobs(frozen, policy.temperature, dtype, *shape)
    backend.place(policy, dtype, cfg.train.offload_optimizer)
    if reference is not None:
        backend.place(reference, dtype)
    return model, engine, policy, reference


def setup(
    cfg: Config,
    run_dir: Path,
    engine: RolloutEngine | None = None,
    verifier: Verifier | None = None,
    backend: TrainingBackend | None = None,
    workers: RemoteWorkers | None = None,
) -> Run:
    """Load the policy, its engine, the reference (only with a KL term), the scorer and the data, each
    placed by ``backend`` (default: this process; FSDP2 ranks shard the models and split the engine's
    and the scorer's calls)."""
    # 1. the plan on this device, and what is checked before anything loads
    backend = backend or SingleProcess()
    apply_threads(cfg.run.threads)  # torch's threads: the cores other work leaves free (run.threads chooses)
    device = resolve_device(cfg.model.device)
    plan = resolve(cfg, device.type, backend.parallel.world_size)  # the one resolve of the run (the producer's too)
    terms = preflight(cfg)
    memory = check_memory(cfg, device, plan.world_size)  # from the model's config: before any weight loads
    plan = with_planned_settings(cfg, plan, memory, backend.parallel)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    dtype = plan.forward_torch_dtype
    # 2. what needs no model: the tokenizer, the refusals, the prompts (their lengths), the offline data
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    processor = vision_processor(cfg.model.name_or_path)
    refuse_not_run_together(cfg, RunFacts(vision_language=processor is not None, engine_given=engine is not None))
    stream = TrainingStream(data_spec(cfg), cfg.run.seed)
    encoder = prompt_encoder(cfg, tokenizer, processor)
    check_prompts(cfg, stream, checked_encoder(cfg, encoder))  # the prompts and the held-out set, before any model
    offline = None
    if cfg.algo.offline != "none":  # a malformed file fails here, before the models load
        offline = OfflineData(
            cfg.data.offline_path, cfg.algo.offline, cfg.train.minibatch_sequences, cfg.run.seed, len(tokenizer)
        )
    # 3. the models: the policy and its engine, the reference, then the scorer and the updater
    model, engine, policy, reference = load_policy(cfg, plan, device, tokenizer, engine, workers, backend)
    scorer = workers.scorer if workers is not None else build_scorer(cfg, dtype, device, verifier, terms)
    scorer = backend.share_scorer(scorer)
    updater = build_policy_updater(cfg, plan, policy, backend)
    # 4. the rollouts (dense process rewards, T-PPO's pool, the asynchronous producer, the stage), the critic
    process_rewards = (
        ProcessRewards(cfg.reward, ProcessRewardModel(cfg.reward.prm_path, tokenizer, dtype, device))
        if cfg.reward.prm_dense != "off"
        else None
    )
    window = cfg.algo.window_tokens
    rollout_pool = RolloutPool(plan.sequences_per_rollout, window, cfg.rollout.max_response_tokens) if window else None
    producer = None
    if cfg.rollout.max_staleness:  # the producer generates; this process's engine serves evaluation
        producer, engine = asynchronous_rollouts(
            cfg, plan, backend, model, engine, workers, stream, verifier, rollout_pool
        )
    settings = RolloutSettings.of(cfg, plan)
    collector = RolloutCollector(settings, engine, tokenizer, scorer, stream, encoder, process_rewards)
    critic = build_critic(cfg, plan, device, backend) if plan.uses_critic else None  # (after: the RNG's order)
    # an environment run's evaluation plays episodes: the training rollouts' own conversations (one environment,
    # one sandbox, one connection for both), or its own where an asynchronous run's producer plays elsewhere
    episodes = ConversationCollector(collector) if cfg.rollout.multiturn in ("tool", "env") else None
    rollout = producer or training_rollouts(cfg, collector, rollout_pool, conversations=episodes)
    return Run(
        cfg=cfg,
        plan=plan,
        outputs=RunOutputs(run_dir=run_dir, saved_tokenizer=processor if processor is not None else tokenizer),
        backend=backend,
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        reference=reference,
        evaluation=HeldOutEvaluation(scorer=scorer, encoder=encoder, episodes=episodes),
        collector=collector,
        rollout=rollout,
        updater=updater,
        kl=kl_controller(cfg),
        critic=critic,
        offline=offline,
        health=RunHealth(engine_name(cfg, device.type), cfg.train.constant_reward_stop_steps),
    )
