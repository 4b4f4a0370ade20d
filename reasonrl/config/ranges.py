"""Checks of single settings: every number finite (and within float32), each setting within its range."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from reasonrl.config.schema import Config

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: the trainer's tensors, and so every number setting and reward, stay within ±FLOAT32_MAX."""


def finite_number(value: float) -> bool:
    """Whether a number setting means something: finite, and finite in float32 too (1e39 is a Python float but
    inf in a tensor; torch refuses a learning rate of 1e39 with a traceback)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def non_finite_settings(settings: Any, prefix: str = "") -> list[str]:
    """A problem per number setting of ``settings`` (a settings dataclass, groups included) that is NaN, an
    infinity or beyond float32's range: no setting means anything there (a Config built in Python skips the
    loader's check)."""
    problems = []
    for item in dataclasses.fields(settings):
        value, key = getattr(settings, item.name), f"{prefix}{item.name}"
        if dataclasses.is_dataclass(value):
            problems += non_finite_settings(value, f"{key}.")
            continue
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not finite_number(v) for v in values):
            problems.append(f"{key}: expected a finite number, got {value!r}")
    return problems


def range_problems(cfg: Config) -> list[str]:
    """Single-field range checks."""
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    checks = [
        (r.rollout_prompts >= 1, "rollout.rollout_prompts must be >= 1"),
        (r.samples_per_prompt >= 1, "rollout.samples_per_prompt must be >= 1"),
        (r.max_prompt_tokens >= 1, "rollout.max_prompt_tokens must be >= 1"),
        (r.max_response_tokens >= 1, "rollout.max_response_tokens must be >= 1"),
        (r.temperature > 0, "rollout.temperature must be > 0"),
        (0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (r.top_k is None or r.top_k >= 1, "rollout.top_k must be >= 1 (or null to disable)"),
        (r.fire.temperature > 0, "rollout.fire.temperature must be > 0"),
        (r.fire.top_k >= 1, "rollout.fire.top_k must be >= 1"),
        (0 < r.vllm.gpu_memory_utilization <= 1, "rollout.vllm.gpu_memory_utilization must be in (0, 1]"),
        (r.vllm.tensor_parallel_size >= 1, "rollout.vllm.tensor_parallel_size must be >= 1"),
        (r.vllm.cpu_kv_cache_gib >= 1, "rollout.vllm.cpu_kv_cache_gib must be >= 1"),
        (r.vllm.weight_bucket_mb >= 1, "rollout.vllm.weight_bucket_mb must be >= 1"),
        (
            # a response cap below 1 is its own problem: no position is checked against it
            bool(r.fire.positions)
            and (r.max_response_tokens < 1 or all(0 <= p < r.max_response_tokens for p in r.fire.positions)),
            "rollout.fire.positions must be response positions in [0, rollout.max_response_tokens)",
        ),
        (0 <= a.gamma <= 1, "algo.gamma must be in [0, 1]"),
        (0 <= a.lambda_policy <= 1, "algo.lambda_policy must be in [0, 1]"),
        (0 <= a.lambda_critic <= 1, "algo.lambda_critic must be in [0, 1]"),
        (a.length_alpha > 0, "algo.length_alpha must be > 0"),
        (0 <= a.eps_low < 1, "algo.eps_low must be in [0, 1)"),
        (a.eps_high >= 0, "algo.eps_high must be >= 0"),
        (a.dual_clip is None or a.dual_clip > 1, "algo.dual_clip must be > 1 (or null to disable)"),
        (a.loss_agg_constant is None or a.loss_agg_constant > 0, "algo.loss_agg_constant must be > 0"),
        (a.nll_weight >= 0, "algo.nll_weight must be >= 0"),
        (a.kl_coef >= 0, "algo.kl_coef must be >= 0"),
        (a.kl_target > 0, "algo.kl_target must be > 0"),
        (a.kl_horizon >= 1, "algo.kl_horizon must be >= 1"),
        (a.value_clip is None or a.value_clip > 0, "algo.value_clip must be > 0 (or null to disable)"),
        (a.value_pretrain_steps >= 0, "algo.value_pretrain_steps must be >= 0"),
        (a.oversample_factor >= 1, "algo.oversample_factor must be >= 1"),
        (a.max_generation_passes >= 0, "algo.max_generation_passes must be >= 0 (0 = unlimited)"),
        (a.overlong_penalty_factor >= 0, "algo.overlong_penalty_factor must be >= 0"),
        (cfg.model.lora_rank >= 0, "model.lora_rank must be >= 0 (0 = full fine-tuning)"),
        (cfg.model.lora_alpha > 0, "model.lora_alpha must be > 0"),
        (bool(cfg.model.lora_target_modules), "model.lora_target_modules must name layers (or be all-linear)"),
        (t.rollout_steps >= 1, "train.rollout_steps must be >= 1"),
        (t.lr > 0, "train.lr must be > 0"),
        (t.warmup_rollout_steps >= 0, "train.warmup_rollout_steps must be >= 0"),
        (t.weight_decay >= 0, "train.weight_decay must be >= 0"),
        (t.grad_clip is None or t.grad_clip > 0, "train.grad_clip must be > 0 (or null to disable)"),
        (t.epochs_per_rollout >= 1, "train.epochs_per_rollout must be >= 1"),
        (t.minibatch_sequences >= 1, "train.minibatch_sequences must be >= 1"),
        (t.constant_reward_stop_steps >= 0, "train.constant_reward_stop_steps must be >= 0 (0 = never stop)"),
        (cfg.critic.lr is None or cfg.critic.lr > 0, "critic.lr must be > 0 (or null for 2 × train.lr)"),
        (cfg.reward.timeout_seconds > 0, "reward.timeout_seconds must be > 0"),
        (cfg.reward.workers >= 1, "reward.workers must be >= 1"),
        (cfg.reward.max_error_fraction > 0, "reward.max_error_fraction must be > 0 (1 = stop when every call fails)"),
        (cfg.data.eval_prompts >= 0, "data.eval_prompts must be >= 0"),
        (cfg.data.arithmetic_digits >= 1, "data.arithmetic_digits must be >= 1"),
        (
            bool(cfg.data.arithmetic_operations) and set(cfg.data.arithmetic_operations) <= set("+-*"),
            "data.arithmetic_operations must be made of the operators + - *",
        ),
        (cfg.run.eval_every >= 1, "run.eval_every must be >= 1"),
        (cfg.run.save_every >= 1, "run.save_every must be >= 1"),
        (cfg.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1"),
        (cfg.run.log_samples >= 0, "run.log_samples must be >= 0 (0 = none)"),
        (
            cfg.run.threads is None or cfg.run.threads >= 1,
            "run.threads must be >= 1 (or null: chosen from the free cores)",
        ),
    ]
    return [message for ok, message in checks if not ok]
