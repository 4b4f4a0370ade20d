"""Which rollout stage a run trains on, built from the settings in one place (``training_rollouts``), and the
builders of the asynchronous mode (rollout.max_staleness ≥ 1): its producer (a process of its own, or a thread of
rank 0 on Ray's remote engines), the collector the producer builds there, and the engine the trainer keeps."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from reasonrl.config import Config, Plan
from reasonrl.config.plan import vllm_engine_options
from reasonrl.data.source import TrainingStream
from reasonrl.models.load import load_model, load_tokenizer, resolve_device
from reasonrl.reward.verifier_protocol import Scorer, Verifier
from reasonrl.rollout import RolloutEngine, build_engine
from reasonrl.rollout.tppo_pool import RolloutPool
from reasonrl.training.backend import TrainingBackend
from reasonrl.training.placement.parallel import RankZeroEngine, RemoteWorkers
from reasonrl.training.rollouts.async_rollouts import AsyncRollouts, PublishingEngine
from reasonrl.training.rollouts.conversation_stage import ConversationCollector
from reasonrl.training.rollouts.engine_versions import EngineVersions, EvaluationEngine, ProducerEngine
from reasonrl.training.rollouts.producer import ProducerPolicy, ProducerProcess, ProducerThread, producer_gpu
from reasonrl.training.rollouts.rollout_stage import PoolCollector, RolloutCollector, RolloutSettings, RolloutStage
from reasonrl.training.run_inputs import build_scorer, data_spec, preflight, prompt_encoder


def asynchronous_rollouts(
    cfg: Config,
    plan: Plan,
    backend: TrainingBackend,
    model: torch.nn.Module,
    engine: RolloutEngine,
    workers: RemoteWorkers | None,
    stream: TrainingStream,
    verifier: Verifier | None,
    rollout_pool: RolloutPool | None,
) -> tuple[AsyncRollouts, RolloutEngine]:
    """The producer of an asynchronous run (rollout.max_staleness ≥ 1) and the engine the trainer then
    evaluates with, which publishes each update's weights to the producer.

    A producer process builds its own engine and scorer. With remote workers (Ray) the producer is a thread of
    rank 0 that generates on the rollout workers and scores on the reward workers; evaluation shares the
    rollout workers, each call at its own version (``EngineVersions``), and rank 0 alone calls them, for
    every rank (``RankZeroEngine``): only rank 0 knows which version they hold."""
    current = lambda: backend.engine_weights(model, engine)  # noqa: E731
    parallel = backend.parallel
    if workers is None:
        transport = ProducerProcess(
            producer_collector, verifier, spare_gpu(plan), share_cores=plan.device_type == "cpu"
        )
        producer = AsyncRollouts(cfg, plan, transport, stream, current, rollout_pool, parallel)
        return producer, PublishingEngine(engine, producer)
    versions = EngineVersions(workers.engine) if parallel.is_main else None
    build = functools.partial(shared_engine_collector, versions, workers.scorer)
    producer = AsyncRollouts(cfg, plan, ProducerThread(build, versions), stream, current, rollout_pool, parallel)
    evaluation = RankZeroEngine(EvaluationEngine(versions) if versions else workers.engine, parallel)
    return producer, PublishingEngine(evaluation, producer)


def spare_gpu(plan: Plan) -> str | None:
    """The GPU an asynchronous run's producer takes: one that no trainer rank on this machine uses."""
    if plan.device_type != "cuda":
        return None
    trainer_gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return producer_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), trainer_gpus)


def producer_collector(
    cfg: Config, plan: Plan, state: dict, verifier: Verifier | None, policy: ProducerPolicy
) -> RolloutStage:
    """The rollout producer's collector (rollout.max_staleness ≥ 1), built in its own process from the
    config (and the run's own ``verifier``, pickled across): the policy's engine as ``policy`` wraps it
    (its weights come from the trainer before the first batch) and the scorer (``producer_rollouts``)."""
    device = resolve_device(cfg.model.device)  # "cuda" is the producer's own GPU (its CUDA_VISIBLE_DEVICES)
    dtype = plan.forward_torch_dtype
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    model = load_model(cfg.model.name_or_path, dtype, plan.attention, device)
    engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
    scorer = build_scorer(cfg, dtype, device, verifier, preflight(cfg))
    return producer_rollouts(cfg, plan, state, policy, policy.engine_for(engine), scorer, tokenizer)


def shared_engine_collector(
    versions: EngineVersions,
    scorer: Scorer,
    cfg: Config,
    plan: Plan,
    state: dict,
    verifier: Any,
    policy: ProducerPolicy,
) -> RolloutStage:
    """The collector of a producer thread on remote engines (dist.backend=ray): the rollout workers at the
    producer's version (``versions``) and the reward workers (``scorer``), both shared with evaluation."""
    tokenizer = load_tokenizer(cfg.model.name_or_path)  # its own: a thread does not share the trainer's
    engine = policy.engine_for(ProducerEngine(versions))
    return producer_rollouts(cfg, plan, state, policy, engine, scorer, tokenizer)


def producer_rollouts(
    cfg: Config, plan: Plan, state: dict, policy: ProducerPolicy, engine: RolloutEngine, scorer: Scorer, tokenizer
) -> RolloutStage:
    """The producer's rollouts through ``engine`` and ``scorer``: its own prompt stream at ``state["stream"]``,
    T-PPO's pool at ``state["pool"]`` or multi-turn conversations where the run has them, each batch tagged
    with the version ``policy`` holds."""
    stream = TrainingStream(data_spec(cfg), cfg.run.seed)
    stream.load_state_dict(state["stream"])
    rollout_pool = None
    if cfg.algo.window_tokens:
        rollout_pool = RolloutPool(plan.sequences_per_rollout, cfg.algo.window_tokens, cfg.rollout.max_response_tokens)
        rollout_pool.load_state_dict(state["pool"])
    settings = RolloutSettings.of(cfg, plan)
    collector = RolloutCollector(settings, engine, tokenizer, scorer, stream, prompt_encoder(cfg, tokenizer))
    return training_rollouts(cfg, collector, rollout_pool, sampling_version=lambda step: policy.loaded)


def training_rollouts(
    cfg: Config,
    collector: RolloutCollector,
    pool: RolloutPool | None,
    sampling_version: Callable[[int], int] | None = None,
    conversations: ConversationCollector | None = None,
) -> RolloutStage:
    """The rollouts each step trains on: T-PPO's windows of ``pool`` (sampled with the policy version
    ``sampling_version(step)``: step − 1 by default), multi-turn conversations (rollout.multiturn; ``conversations``
    where they are built already), else ``collector``'s synchronous single-turn ones."""
    if pool is not None:
        return PoolCollector(collector, pool, sampling_version)
    if cfg.rollout.multiturn != "none":
        return conversations if conversations is not None else ConversationCollector(collector)
    return collector
