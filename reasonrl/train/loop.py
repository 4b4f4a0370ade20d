"""``fit()``: one RL run as named stages (DESIGN §3).

setup -> restore -> evaluate (before) -> value pretraining (critic presets)
each step: rollout (generate, score, filter, shape; T-PPO: one window of the rollout pool)
           -> log-probs (old, reference) -> values -> advantages -> policy update -> critic update
           -> weight sync -> evaluate? -> log -> checkpoint
-> evaluate (after) -> export -> report
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasonrl.algo.kl import AdaptiveKLController, FixedKLController, kl_estimate
from reasonrl.algo.masked import masked_mean
from reasonrl.batch import RolloutBatch
from reasonrl.config import Config, ConfigError, Plan, resolve
from reasonrl.config.plan import vllm_engine_options
from reasonrl.config.render import render_yaml
from reasonrl.data.loaders import Fields
from reasonrl.data.source import DataSpec, TrainingStream, eval_examples
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer
from reasonrl.models.value import HEAD_FILE, load_value_model, value_model_from_policy
from reasonrl.reward.base import Scorer, Verifier
from reasonrl.reward.math import MathVerifier
from reasonrl.reward.pool import ScoringPool
from reasonrl.reward.router import RewardRouter, resolve_routes
from reasonrl.rollout import RolloutEngine, SamplingParams, build_engine
from reasonrl.rollout.pool import RolloutPool
from reasonrl.train.advantages import assign_advantages
from reasonrl.train.checkpoint import latest_checkpoint, load_checkpoint, load_value_weights, save_checkpoint
from reasonrl.train.critic import CriticUpdater
from reasonrl.train.metrics import MetricsWriter, ProgressDisplay, peak_rss_gb, read_metrics, release_free_memory
from reasonrl.train.policy import response_logprobs
from reasonrl.train.report import CRITIC_PANELS, plot_metrics, write_summary
from reasonrl.train.rollout import PoolCollector, PromptEncoder, RolloutCollector, hash_seed, sample_and_score
from reasonrl.train.step import PolicyUpdater
from reasonrl.train.value_pretrain import pretrain_critic

log = logging.getLogger(__name__)
PLOT_NAME = "training_curves.png"
PRETRAINED_CRITIC = "critic_pretrained"
VALUE_PRETRAIN = "value_pretrain"  # its metrics file (.jsonl) and plot (.png)


@dataclass
class Run:
    """Everything a run holds while it trains."""

    cfg: Config
    plan: Plan
    run_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    engine: RolloutEngine
    reference: torch.nn.Module | None
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

    @property
    def rollout(self) -> RolloutCollector | PoolCollector:
        """The training rollouts' stage (value pretraining always uses synchronous ``collector``)."""
        return self.windowed or self.collector


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


EAGER_ATTENTION_MAX_TOKENS = 512


def training_attention(plan: Plan) -> str | None:
    """Eager attention for short sequences on the CPU, where its backward beats SDPA's
    (`python bench/dtype.py`, key train_eager_over_sdpa); SDPA above 512 tokens, where eager's saved
    T×T attention matrices would cost too much memory."""
    return "eager" if plan.max_sequence_tokens <= EAGER_ATTENTION_MAX_TOKENS and not torch.cuda.is_available() else None


def build_critic(cfg: Config, plan: Plan, attention: str | None, dtype: torch.dtype) -> CriticUpdater:
    """The value model (from the policy's weights, a saved critic or a reward model) and its optimiser."""
    if cfg.critic.init == "policy":
        model = value_model_from_policy(cfg.model.name_or_path, attention)
    else:
        model = load_value_model(cfg.critic.path, attention)
    if cfg.model.gradient_checkpointing:
        model.backbone.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=plan.critic_lr, weight_decay=cfg.train.weight_decay)
    return CriticUpdater(
        model,
        optimizer,
        value_clip=cfg.algo.value_clip,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=cfg.train.microbatch_tokens,
        grad_clip=cfg.train.grad_clip,
        compute_dtype=dtype,
    )


def build_router(cfg: Config, dtype: torch.dtype) -> RewardRouter:
    """The hybrid reward router of a config: verifiers for math and code, judges loaded on first use."""
    from reasonrl.reward.code import CodeVerifier

    judge: list = []

    def genrm():  # one judge serves both GenRM sources
        if not judge:
            from reasonrl.reward.genrm import GenRM

            judge.append(GenRM.from_model(cfg.reward.judge_model or cfg.model.name_or_path, dtype))
        return judge[0]

    def bradley_terry():
        from reasonrl.reward.bt import RewardModel

        if not cfg.reward.reward_model:
            raise ConfigError("task_type 'preference' is routed to the bt source: set reward.reward_model=DIR")
        return RewardModel.load(cfg.reward.reward_model, compute_dtype=dtype)

    return RewardRouter(
        resolve_routes(cfg.reward.routes),
        {"math": MathVerifier(), "code": CodeVerifier()},
        {"genrm_reference": genrm, "genrm_bon": genrm, "bt": bradley_terry},
        workers=cfg.reward.workers,
        timeout=cfg.reward.timeout_seconds,
    )


# --- stages --------------------------------------------------------------------------------------


def setup(cfg: Config, run_dir: Path, engine: RolloutEngine | None = None, verifier: Verifier | None = None) -> Run:
    """Load the policy, its engine, the reference (only with a KL term), the scorer and the data."""
    plan = resolve(cfg)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    dtype = compute_dtype(cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    attention = training_attention(plan)
    model = load_model(cfg.model.name_or_path, torch.float32, attention)  # fp32 master weights
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if engine is None:
        engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
    reference = load_model(cfg.model.name_or_path, dtype, attention) if plan.uses_reference else None
    if verifier is not None:  # a user's verifier scores every task
        pool: Scorer = ScoringPool(verifier, cfg.reward.workers, cfg.reward.timeout_seconds)
    else:
        pool = build_router(cfg, dtype)
    stream = TrainingStream(data_spec(cfg), cfg.run.seed)
    encoder = PromptEncoder(tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    warmup = plan.warmup_optimizer_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    updater = PolicyUpdater(
        model,
        optimizer,
        scheduler,
        cfg.algo,
        minibatch_sequences=cfg.train.minibatch_sequences,
        epochs=cfg.train.epochs_per_rollout,
        microbatch_tokens=cfg.train.microbatch_tokens,
        grad_clip=cfg.train.grad_clip,
        temperature=cfg.rollout.temperature,
        compute_dtype=dtype,
        loss_agg_constant=plan.loss_agg_constant,
    )
    a = cfg.algo
    kl = (
        AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon)
        if a.kl_controller == "adaptive"
        else (FixedKLController(a.kl_coef))
    )
    collector = RolloutCollector(cfg, plan, engine, tokenizer, pool, stream, encoder)
    critic = build_critic(cfg, plan, attention, dtype) if plan.uses_critic else None
    window = cfg.algo.window_tokens
    rollout_pool = RolloutPool(plan.sequences_per_rollout, window, cfg.rollout.max_response_tokens) if window else None
    windowed = PoolCollector(collector, rollout_pool) if rollout_pool is not None else None
    return Run(
        cfg,
        plan,
        run_dir,
        model,
        tokenizer,
        engine,
        reference,
        pool,
        stream,
        encoder,
        collector,
        updater,
        kl,
        dtype,
        critic,
        windowed,
    )


def critic_state(run: Run) -> tuple[torch.nn.Module, torch.optim.Optimizer] | None:
    """What a checkpoint saves of the critic (None without one)."""
    return (run.critic.model, run.critic.optimizer) if run.critic is not None else None


def restore(run: Run) -> dict[str, Any]:
    """Continue from the latest checkpoint when resuming; returns its state (empty for a fresh run)."""
    checkpoint = latest_checkpoint(run.run_dir) if run.cfg.run.resume == "auto" else None
    if checkpoint is None:
        return {}
    state = load_checkpoint(checkpoint, run.model, run.updater.optimizer, run.updater.scheduler, critic_state(run))
    run.stream.load_state_dict(state["stream"])
    run.kl.coef = state["kl_coef"]
    run.updater.skipped_steps = state["skipped_steps"]
    if run.windowed is not None:
        run.windowed.pool.load_state_dict(state["pool"])
    run.engine.load_weights(run.model.state_dict())
    log.warning("resuming from %s (step %d)", checkpoint, state["step"])
    return state


def evaluate(run: Run) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts."""
    examples = eval_examples(data_spec(run.cfg), run.cfg.data.eval_prompts)
    params = SamplingParams(max_new_tokens=run.cfg.rollout.max_response_tokens, temperature=0.0)
    scored = sample_and_score(run.engine, run.tokenizer, run.pool, run.encoder, examples, params)
    lengths = [len(c.token_ids) for c in scored.completions]
    return {
        "eval/accuracy": sum(r.correct for r in scored.results) / max(1, len(scored.results)),
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "perf/eval_seconds": scored.generate_seconds + scored.score_seconds,
    }


def value_pretrain_stage(run: Run, show_progress: bool) -> dict[str, Any]:
    """Train the critic on the frozen initial policy's rollouts, once per run (VC-PPO, VAPO).

    The pretrained critic is saved to ``critic_pretrained/``; a restarted run loads it from there
    instead of pretraining again.  Metrics go to ``value_pretrain.jsonl`` and ``value_pretrain.png``.
    """
    assert run.critic is not None
    saved = run.run_dir / PRETRAINED_CRITIC
    if (saved / HEAD_FILE).exists():
        load_value_weights(run.critic.model, saved)
        log.warning("loaded the pretrained critic from %s", saved)
        return {}
    started = time.perf_counter()
    steps = run.plan.value_pretrain_steps
    writer = MetricsWriter(run.run_dir, name=VALUE_PRETRAIN)
    with ProgressDisplay(steps, 0, enabled=show_progress, label="value pretraining") as progress:
        last = [started]

        def record(step: int, metrics: dict[str, float]) -> None:
            now = time.perf_counter()
            metrics["perf/step_seconds"], last[0] = now - last[0], now
            writer.write(step, metrics)
            progress.update(step, metrics)

        done = pretrain_critic(
            run.collector,
            run.critic,
            steps=steps,
            ev_target=run.cfg.algo.value_pretrain_ev_target,
            gamma=run.cfg.algo.gamma,
            seed=run.cfg.run.seed,
            on_step=record,
            calibrate_bias=run.cfg.critic.init == "policy",
        )
    writer.close()
    records = read_metrics(writer.path)
    plot_metrics(records, run.run_dir / f"{VALUE_PRETRAIN}.png", "value pretraining (policy frozen)", CRITIC_PANELS)
    run.critic.model.save(saved)
    release_free_memory()
    return {
        "value_pretrain_steps": done,
        "value_pretrain_explained_variance": records[-1].get("critic/explained_variance") if records else None,
        "value_pretrain_seconds": time.perf_counter() - started,
    }


def logprob_stage(run: Run, batch: RolloutBatch) -> dict[str, float]:
    """Behaviour (old) log-probs from the trainer's own forward, and reference log-probs if a KL is on."""
    groups = batch.micro_batch_rows(run.cfg.train.microbatch_tokens)

    def forward(model: torch.nn.Module) -> torch.Tensor:
        out = torch.zeros(batch.response_mask.shape)
        with torch.no_grad():
            for rows in groups:
                part = batch.select(rows)
                logprobs, _ = response_logprobs(
                    model,
                    part.prompt_ids,
                    part.prompt_mask,
                    part.response_ids,
                    part.response_mask,
                    temperature=run.cfg.rollout.temperature,
                    compute_dtype=run.compute_dtype,
                )
                out[rows, : logprobs.shape[1]] = logprobs
        return out

    batch.old_logprobs = forward(run.model)
    fire = run.cfg.rollout.fire
    if fire.enabled and fire.logprob == "behaviour":  # the FIRE tokens' true behaviour log-probs
        positions = list(fire.positions)
        batch.old_logprobs[:, positions] = batch.rollout_logprobs[:, positions]
    mask = batch.response_mask
    gap = (batch.old_logprobs - batch.rollout_logprobs).abs()
    if batch.stale_mask is not None:  # T-PPO: earlier windows' tokens were sampled by older policies
        mask = mask & ~batch.stale_mask  # the engine-vs-trainer gap is measured on this window's tokens
        batch.old_logprobs = torch.where(batch.stale_mask, batch.rollout_logprobs, batch.old_logprobs)
    stats = {
        "rollout/logprob_abs_diff": masked_mean(gap, mask).item(),
        "rollout/logprob_max_abs_diff": gap[mask].max().item() if mask.any() else 0.0,
    }
    if run.reference is not None:
        batch.ref_logprobs = forward(run.reference)
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, run.cfg.algo.kl_estimator)
        stats["policy/kl_ref"] = masked_mean(kl, mask).item()
        stats["policy/kl_coef"] = float(run.kl.coef)
    return stats


def checkpoint_stage(run: Run, step: int, extra: dict[str, Any]) -> None:
    """Save everything needed to continue from ``step``."""
    state = {
        "stream": run.stream.state_dict(),
        "kl_coef": float(run.kl.coef),
        "skipped_steps": run.updater.skipped_steps,
        **({"pool": run.windowed.pool.state_dict()} if run.windowed is not None else {}),
        **extra,
    }
    save_checkpoint(
        run.run_dir,
        step,
        run.model,
        run.updater.optimizer,
        run.updater.scheduler,
        state,
        run.cfg.run.keep_checkpoints,
        critic_state(run),
    )


def export_stage(run: Run) -> Path:
    """The final policy as a Hugging Face directory (``from_pretrained`` loads it)."""
    final = run.run_dir / "final"
    run.model.save_pretrained(final)
    run.tokenizer.save_pretrained(final)
    return final


# --- the loop ------------------------------------------------------------------------------------


def fit(
    cfg: Config,
    run_dir: Path,
    *,
    preset: str = "custom",
    overrides: tuple[str, ...] = (),
    engine: RolloutEngine | None = None,
    verifier: Verifier | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Train according to ``cfg`` in ``run_dir``; returns the summary (also written to summary.json)."""
    started = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(render_yaml(cfg))
    run = setup(cfg, run_dir, engine, verifier)
    try:
        state = restore(run)
        start_step = state.get("step", 0)
        writer = MetricsWriter(run_dir, start_step)
        elapsed_before = state.get("wall_seconds", 0.0)
        accuracy_before = state.get("accuracy_before")
        if start_step == 0:
            before = evaluate(run)
            accuracy_before = before["eval/accuracy"]
            writer.write(0, before)
        pretraining = state.get("value_pretraining", {})
        if start_step == 0 and run.plan.value_pretrain_steps:
            pretraining = value_pretrain_stage(run, show_progress)
        total = cfg.train.rollout_steps
        last_eval: dict[str, float] = {}
        with ProgressDisplay(total, start_step, enabled=show_progress) as progress:
            progress.log(f"held-out accuracy before training: {accuracy_before:.1%}")
            for step in range(start_step + 1, total + 1):
                step_start = time.perf_counter()
                batch, metrics = run.rollout.collect(step)
                if run.plan.separate_old_logprob_pass:
                    t0 = time.perf_counter()
                    metrics |= logprob_stage(run, batch)
                    metrics["perf/logprob_seconds"] = time.perf_counter() - t0
                if run.critic is not None:
                    t0 = time.perf_counter()
                    batch.values = run.critic.values(batch)
                    metrics["perf/value_seconds"] = time.perf_counter() - t0
                metrics |= assign_advantages(batch, cfg.algo, float(run.kl.coef))
                if hasattr(run.engine, "sleep"):  # vLLM sleep mode: the update gets its GPU memory
                    run.engine.sleep()
                t0 = time.perf_counter()
                metrics |= run.updater.update(batch, seed=hash_seed(cfg.run.seed, step), kl_coef=float(run.kl.coef))
                metrics["perf/update_seconds"] = time.perf_counter() - t0
                if run.critic is not None:
                    t0 = time.perf_counter()
                    metrics |= run.critic.update(batch, seed=hash_seed(cfg.run.seed, step))
                    metrics["perf/critic_update_seconds"] = time.perf_counter() - t0
                run.engine.load_weights(run.model.state_dict())
                release_free_memory()
                if "policy/kl_ref" in metrics:
                    run.kl.update(metrics["policy/kl_ref"], len(batch))
                if step % cfg.run.eval_every == 0 or step == total:
                    last_eval = evaluate(run)
                    metrics |= last_eval
                metrics["perf/step_seconds"] = time.perf_counter() - step_start
                tokens = metrics["rollout/tokens_generated"]
                metrics["perf/tokens_per_second"] = tokens / metrics["perf/step_seconds"]
                metrics["perf/generation_tokens_per_second"] = tokens / max(1e-9, metrics["perf/generate_seconds"])
                metrics["perf/peak_rss_gb"] = peak_rss_gb()
                writer.write(step, metrics)
                progress.update(step, metrics)
                if step % cfg.run.save_every == 0 or step == total:
                    wall = elapsed_before + time.perf_counter() - started
                    extra = {"accuracy_before": accuracy_before, "wall_seconds": wall, "value_pretraining": pretraining}
                    checkpoint_stage(run, step, extra)
        after = last_eval or evaluate(run)
        final = export_stage(run)
        writer.close()
        plot_metrics(read_metrics(writer.path), run_dir / PLOT_NAME, f"{preset}: {cfg.model.name_or_path}")
        summary = {
            "preset": preset,
            "overrides": list(overrides),
            "model": cfg.model.name_or_path,
            "steps": total,
            "eval_prompts": cfg.data.eval_prompts,
            "accuracy_before": accuracy_before,
            "accuracy_after": after["eval/accuracy"],
            "wall_seconds": elapsed_before + time.perf_counter() - started,
            "peak_rss_gb": peak_rss_gb(),
            "plot": PLOT_NAME,
            "final_model": final.name,
            **pretraining,
        }
        write_summary(run_dir, summary)
        return summary
    finally:
        run.pool.close()
