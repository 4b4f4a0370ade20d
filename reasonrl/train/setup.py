"""Setting a run up: the policy, its engine, the reference, the critic, the scorer and the data, as one
``Run`` (one process, or one data-parallel rank: then the models are FSDP2-sharded)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasonrl.algo.kl import AdaptiveKLController, FixedKLController
from reasonrl.config import Config, ConfigError, Plan, resolve
from reasonrl.config.plan import microbatch_token_budget, vllm_engine_options
from reasonrl.data.loaders import Fields
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import DataSpec, TrainingStream
from reasonrl.models.load import (
    attention_implementation,
    compute_dtype,
    load_model,
    load_tokenizer,
    resolve_device,
    vision_processor,
)
from reasonrl.models.lora import add_lora
from reasonrl.models.optim import trainable_parameters
from reasonrl.models.value import load_value_model, rescale_head, value_model_from_policy
from reasonrl.reward.base import Scorer, Verifier
from reasonrl.reward.custom import RewardFunctionError, RewardTerm, WeightedRewards, reward_terms
from reasonrl.reward.pool import ScoringPool
from reasonrl.reward.prm import ProcessRewardModel
from reasonrl.reward.router import build_router
from reasonrl.rollout import RolloutEngine, build_engine
from reasonrl.rollout.pool import RolloutPool
from reasonrl.train.critic import CriticUpdater
from reasonrl.train.multiturn import ConversationCollector, prompt_tools
from reasonrl.train.offline import OfflineData
from reasonrl.train.parallel import (
    SINGLE_PROCESS,
    DataParallel,
    RemoteWorkers,
    ShardedEngine,
    ShardedScorer,
    shard_module,
)
from reasonrl.train.policy import TokenLogprobs
from reasonrl.train.process_rewards import ProcessRewards
from reasonrl.train.rollout import PoolCollector, RolloutCollector
from reasonrl.train.step import PolicyUpdater
from reasonrl.train.trackers import Tracker, TrackerError, check_trackers


@dataclass(kw_only=True)
class Run:
    """Everything a run holds while it trains."""

    cfg: Config
    plan: Plan
    run_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    engine: RolloutEngine
    reference: TokenLogprobs | None
    """The frozen KL reference (None without a KL term, and with LoRA: then the policy's base is the reference)."""
    pool: Scorer
    stream: TrainingStream
    encoder: PromptEncoder
    collector: RolloutCollector
    updater: PolicyUpdater
    kl: FixedKLController | AdaptiveKLController
    compute_dtype: torch.dtype
    critic: CriticUpdater | None
    windowed: PoolCollector | None
    """T-PPO's truncated rollouts (algo.window_tokens); None = synchronous rollouts by ``collector``."""
    conversations: ConversationCollector | None
    """Multi-turn rollouts (rollout.multiturn); None = one response per prompt."""
    microbatch_tokens: int
    """The token budget of one forward micro-batch (train.microbatch_tokens, resolved for the device)."""
    offline: OfflineData | None = None
    """The offline dataset of algo.offline (dpo, dqo); None = online RL."""
    parallel: DataParallel = SINGLE_PROCESS
    """The data-parallel group this process trains in (one process by default)."""
    trackers: list[Tracker] = field(default_factory=list)
    """The experiment trackers of run.loggers, shared by the metrics streams (opened by ``fit``)."""
    processor: Any = None
    """A vision-language policy's processor (images to pixel inputs and image tokens); None for a text model."""

    @property
    def saved_tokenizer(self) -> Any:
        """What a checkpoint and the exported model save beside the weights: the processor of a
        vision-language model (its tokenizer, image processor and chat template), else the tokenizer."""
        return self.processor if self.processor is not None else self.tokenizer

    @property
    def rollout(self) -> RolloutCollector | PoolCollector | ConversationCollector:
        """The training rollouts' stage (value pretraining always uses synchronous ``collector``)."""
        return self.windowed or self.conversations or self.collector


def data_spec(cfg: Config) -> DataSpec:
    """The data settings of a config."""
    d = cfg.data
    return DataSpec(
        d.dataset,
        d.eval_dataset,
        d.arithmetic_digits,
        d.arithmetic_operations,
        Fields(d.question_field, d.answer_field),
        d.task_mix,
    )


def build_critic(
    cfg: Config,
    plan: Plan,
    attention: str | None,
    dtype: torch.dtype,
    device: torch.device,
    parallel: DataParallel = SINGLE_PROCESS,
) -> CriticUpdater:
    """The value model (from the policy's weights, a saved critic or a reward model) on ``device``, and its
    optimiser."""
    if cfg.critic.init == "policy":
        model = value_model_from_policy(cfg.model.name_or_path, attention, device)
    elif cfg.critic.init == "prm":  # the PRM's success probability, on the reward scale (arXiv 2410.17621)
        low, high = cfg.reward.incorrect_score, cfg.reward.correct_score
        model = rescale_head(load_value_model(cfg.critic.path or cfg.reward.prm_path, attention), high - low, low)
        model = model.to(device)
    else:
        model = load_value_model(cfg.critic.path, attention).to(device)
    if cfg.model.gradient_checkpointing:
        model.backbone.gradient_checkpointing_enable()
    add_lora(model.backbone, cfg.model)  # with LoRA the head still trains fully
    if parallel.active:
        shard_module(model, parallel)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=plan.critic_lr, weight_decay=cfg.train.weight_decay)
    return CriticUpdater(
        model,
        optimizer,
        value_clip=cfg.algo.value_clip,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=microbatch_token_budget(cfg, device.type),
        grad_clip=cfg.train.grad_clip,
        compute_dtype=dtype,
        parallel=parallel,
    )


def preflight(cfg: Config) -> list[RewardTerm]:
    """What the user plugs in, checked before any model loads: the trackers' packages, and the terms of
    ``reward.functions`` (each function imported once); a problem is a ConfigError."""
    try:
        check_trackers(cfg.run.loggers)
        return reward_terms(cfg.reward.functions, cfg.reward.weights)
    except (RewardFunctionError, TrackerError) as exc:
        raise ConfigError(str(exc)) from None


def check_vision_language(cfg: Config, parallel: DataParallel) -> None:
    """Refuse, before the models load, what a vision-language policy does not support yet: multi-turn
    and T-PPO rollouts, offline data, LoRA, data parallelism and Ray workers, and text-only reward or
    value models reading its prompts (a ConfigError naming the setting)."""
    unsupported = {
        "rollout.multiturn": cfg.rollout.multiturn != "none",
        "algo.window_tokens (T-PPO)": bool(cfg.algo.window_tokens),
        "algo.offline": cfg.algo.offline != "none",
        "model.lora_rank": bool(cfg.model.lora_rank),
        "data parallelism": parallel.active,
        "dist.backend=ray": cfg.dist.backend == "ray",
        "reward.prm_dense (a text PRM)": cfg.reward.prm_dense != "off",
        f"critic.init={cfg.critic.init} (a text model)": cfg.critic.init in ("reward_model", "prm"),
    }
    named = [name for name, used in unsupported.items() if used]
    if named:
        raise ConfigError(
            f"{cfg.model.name_or_path} is a vision-language model, which reasonrl does not train with "
            f"{', '.join(named)} yet; train it with single-turn rollouts, full fine-tuning, in one process"
        )


def build_scorer(
    cfg: Config,
    dtype: torch.dtype,
    device: torch.device,
    verifier: Verifier | None = None,
    terms: list[RewardTerm] | None = None,
) -> Scorer:
    """What scores the responses: a user's ``verifier`` for every task, else the reward router of
    ``cfg``, and with ``reward.functions`` (``terms``) their weighted sum, that scorer as the "verifier" term."""
    if verifier is not None:
        pool: Scorer = ScoringPool(verifier, cfg.reward.workers, cfg.reward.timeout_seconds)
    else:
        pool = build_router(cfg, dtype, device)
    if terms:
        pool = WeightedRewards(terms, pool, workers=cfg.reward.workers, timeout=cfg.reward.timeout_seconds)
    return pool


def setup(
    cfg: Config,
    run_dir: Path,
    engine: RolloutEngine | None = None,
    verifier: Verifier | None = None,
    parallel: DataParallel = SINGLE_PROCESS,
    workers: RemoteWorkers | None = None,
) -> Run:
    """Load the policy, its engine, the reference (only with a KL term), the scorer and the data.
    Data-parallel: the policy, reference and critic are sharded with FSDP2, and the engine generates
    this rank's share of each call."""
    plan = resolve(cfg)
    terms = preflight(cfg)
    device = resolve_device(cfg.model.device)
    attention = attention_implementation(cfg.model.attention, device, plan.max_sequence_tokens)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    dtype = compute_dtype(cfg.model.dtype)
    microbatch_tokens = microbatch_token_budget(cfg, device.type)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    processor = vision_processor(cfg.model.name_or_path)
    if processor is not None:
        check_vision_language(cfg, parallel)
    offline = None
    if cfg.algo.offline != "none":  # a malformed file fails here, before the models load
        offline = OfflineData(
            cfg.data.offline_path, cfg.algo.offline, cfg.train.minibatch_sequences, cfg.run.seed, len(tokenizer)
        )
    model = load_model(cfg.model.name_or_path, torch.float32, attention, device)  # fp32 master weights
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if workers is not None:
        engine = workers.engine
    elif engine is None:
        engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
    if parallel.active:
        engine = ShardedEngine(engine, parallel)
    add_lora(model, cfg.model)  # after the engine took the plain weights (a fresh adapter changes nothing)
    policy = TokenLogprobs(model, cfg.rollout.temperature, dtype)
    separate_reference = plan.uses_reference and not cfg.model.lora_rank  # LoRA: the frozen base is the reference
    reference = None
    if separate_reference:
        frozen = load_model(cfg.model.name_or_path, dtype, attention, device)
        reference = TokenLogprobs(frozen, policy.temperature, dtype)
    if parallel.active:
        for module in (policy, reference):
            if module is not None:
                shard_module(module, parallel)
    pool = workers.scorer if workers is not None else build_scorer(cfg, dtype, device, verifier, terms)
    if parallel.active:
        pool = ShardedScorer(pool, parallel)
    stream = TrainingStream(data_spec(cfg), cfg.run.seed)
    encoder = PromptEncoder(
        tokenizer,
        cfg.data.prompt_template,
        cfg.rollout.max_prompt_tokens,
        cfg.data.system_prompt,
        tools=prompt_tools(cfg.rollout, tokenizer),
        processor=processor,
    )
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    warmup = plan.warmup_optimizer_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    updater = PolicyUpdater(
        policy,
        optimizer,
        scheduler,
        cfg.algo,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=microbatch_tokens,
        grad_clip=cfg.train.grad_clip,
        loss_agg_constant=plan.loss_agg_constant,
        parallel=parallel,
    )
    a = cfg.algo
    kl = (
        AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon)
        if a.kl_controller == "adaptive"
        else (FixedKLController(a.kl_coef))
    )
    process_rewards = (
        ProcessRewards(cfg.reward, ProcessRewardModel(cfg.reward.prm_path, tokenizer, dtype, device))
        if cfg.reward.prm_dense != "off"
        else None
    )
    collector = RolloutCollector(cfg, plan, engine, tokenizer, pool, stream, encoder, process_rewards)
    critic = build_critic(cfg, plan, attention, dtype, device, parallel) if plan.uses_critic else None
    window = cfg.algo.window_tokens
    rollout_pool = RolloutPool(plan.sequences_per_rollout, window, cfg.rollout.max_response_tokens) if window else None
    windowed = PoolCollector(collector, rollout_pool) if rollout_pool is not None else None
    return Run(
        cfg=cfg,
        plan=plan,
        run_dir=run_dir,
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        reference=reference,
        pool=pool,
        stream=stream,
        encoder=encoder,
        collector=collector,
        updater=updater,
        kl=kl,
        compute_dtype=dtype,
        critic=critic,
        windowed=windowed,
        conversations=ConversationCollector(collector) if cfg.rollout.multiturn != "none" else None,
        microbatch_tokens=microbatch_tokens,
        offline=offline,
        parallel=parallel,
        processor=processor,
    )
