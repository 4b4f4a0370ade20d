"""Cross-field checks that run before anything heavy loads.

Every problem is reported at once, each with the keys involved and a way to fix it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from reasonrl.config.combinations import RunFacts, data_parallel_size, not_run_together
from reasonrl.config.config_error import listing
from reasonrl.config.schema import Config


def _divisors_near(n: int, target: int, count: int = 3) -> list[int]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return sorted(sorted(divisors, key=lambda d: abs(d - target))[:count])


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


def _ranges(cfg: Config) -> list[str]:
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


def _batch_sizes(cfg: Config) -> list[str]:
    r, t = cfg.rollout, cfg.train
    sequences = r.rollout_prompts * r.samples_per_prompt
    problems = []
    online = cfg.algo.offline == "none"
    if online and sequences >= 1 and t.minibatch_sequences >= 1 and sequences % t.minibatch_sequences:
        options = " or ".join(str(d) for d in _divisors_near(sequences, t.minibatch_sequences))
        problems.append(
            f"train.minibatch_sequences={t.minibatch_sequences} does not divide the {sequences} responses of a "
            f"rollout step (rollout.rollout_prompts={r.rollout_prompts} × rollout.samples_per_prompt="
            f"{r.samples_per_prompt}); use a divisor such as {options}, or change the rollout size"
        )
    longest = r.max_prompt_tokens + r.max_response_tokens
    if r.vllm.max_model_len is not None and r.vllm.max_model_len < longest:
        problems.append(
            f"rollout.vllm.max_model_len={r.vllm.max_model_len} is shorter than the longest sequence "
            f"(rollout.max_prompt_tokens + rollout.max_response_tokens = {longest}); raise it or leave it null"
        )
    if t.microbatch_tokens is not None and t.microbatch_tokens < longest:
        problems.append(
            f"train.microbatch_tokens={t.microbatch_tokens} cannot hold one full sequence "
            f"(rollout.max_prompt_tokens + rollout.max_response_tokens = {longest}); raise it to at least {longest}"
        )
    return problems


def _distributed(cfg: Config) -> list[str]:
    d, r, t = cfg.dist, cfg.rollout, cfg.train
    problems = [
        f"dist.{key}={value} must be at least 1"
        for key, value in (
            ("rollout_workers", d.rollout_workers),
            ("trainer_workers", d.trainer_workers),
            ("reward_workers", d.reward_workers),
        )
        if value < 1
    ]
    ranks = data_parallel_size(cfg)
    where = "dist.trainer_workers" if d.backend == "ray" else "the torchrun processes (WORLD_SIZE)"
    if ranks > 1 and r.rollout_prompts % ranks:
        problems.append(
            f"rollout.rollout_prompts={r.rollout_prompts} cannot be split evenly over {ranks} data-parallel ranks "
            f"({where}); use a multiple of {ranks}, or another number of ranks"
        )
    if ranks > 1 and t.minibatch_sequences % ranks:
        problems.append(
            f"train.minibatch_sequences={t.minibatch_sequences} cannot be split evenly over {ranks} data-parallel "
            f"ranks ({where}); use a multiple of {ranks}"
        )
    if ranks > 1 and cfg.model.lora_rank:
        problems.append("model.lora_rank with several data-parallel ranks is not supported yet; train on one process")
    return problems


def _algorithm(cfg: Config) -> list[str]:
    a, r = cfg.algo, cfg.rollout
    problems = []
    if a.uses_groups and r.samples_per_prompt < 2:
        problems.append(
            f"algo.advantage_estimator='{a.advantage_estimator}' compares the responses to one prompt, but "
            "rollout.samples_per_prompt=1 leaves every group alone; set rollout.samples_per_prompt >= 2 "
            "or use algo.advantage_estimator=gae"
        )
    if a.dynamic_sampling and r.samples_per_prompt < 2:
        problems.append(
            "algo.dynamic_sampling keeps groups whose responses disagree, which needs "
            "rollout.samples_per_prompt >= 2; raise it or set algo.dynamic_sampling=false"
        )
    if a.lambda_policy_mode == "length_adaptive" and not a.uses_critic:
        problems.append(
            "algo.lambda_policy_mode=length_adaptive is a GAE setting, but "
            f"algo.advantage_estimator='{a.advantage_estimator}' has no GAE; use gae/egae or lambda_policy_mode=fixed"
        )
    if (a.advantage_estimator == "egae") != (a.window_tokens is not None):
        problems.append(
            "algo.advantage_estimator=egae and algo.window_tokens go together (T-PPO truncated rollouts): "
            "set both, or neither"
        )
    if a.window_tokens is not None and not 1 <= a.window_tokens < r.max_response_tokens:
        problems.append(
            f"algo.window_tokens={a.window_tokens} must be between 1 and rollout.max_response_tokens="
            f"{r.max_response_tokens} (exclusive) for truncated rollouts to continue across steps"
        )
    if a.policy_tokens != "window" and a.window_tokens is None:
        problems.append("algo.policy_tokens applies to truncated rollouts only: set algo.window_tokens too")
    if r.environment is not None and r.multiturn != "env":
        problems.append(f"rollout.environment={r.environment} needs rollout.multiturn=env")
    if r.multiturn != "none":
        python_tool = r.multiturn == "tool" or r.environment == "python"
        if python_tool and (r.max_tool_calls < 1 or r.tool_timeout_seconds <= 0):
            problems.append(
                "rollout.max_tool_calls must be >= 1 and rollout.tool_timeout_seconds > 0 with the python tool"
            )
        if python_tool and r.tool_batch_timeout_seconds < r.tool_timeout_seconds:
            problems.append(
                f"rollout.tool_batch_timeout_seconds={r.tool_batch_timeout_seconds:g} must be >= "
                f"rollout.tool_timeout_seconds={r.tool_timeout_seconds:g}: a turn's calls share it"
            )
        problems += _environment(cfg)
        if r.max_attempts < 1 or (r.multiturn == "direct" and r.max_attempts < 2):
            problems.append(f"rollout.max_attempts={r.max_attempts} must be >= 1 (>= 2 with rollout.multiturn=direct)")
        if r.max_conversation_tokens is not None and r.max_conversation_tokens < r.max_response_tokens:
            problems.append(
                f"rollout.max_conversation_tokens={r.max_conversation_tokens} must be >= "
                f"rollout.max_response_tokens={r.max_response_tokens}"
            )
    cache = a.overlong_cache_tokens
    if a.overlong == "soft" and cache is not None and not 1 <= cache < r.max_response_tokens:
        problems.append(
            f"algo.overlong_cache_tokens={cache} must be between 1 and "
            f"rollout.max_response_tokens={r.max_response_tokens} (exclusive); null = 20% of the cap"
        )
    if a.value_pretrain_steps > 0 and not a.uses_critic:
        problems.append(
            f"algo.value_pretrain_steps={a.value_pretrain_steps} trains a critic, but "
            f"algo.advantage_estimator='{a.advantage_estimator}' uses none; set it to 0 or use gae"
        )
    if a.kl_controller == "adaptive" and a.kl_placement == "none":
        problems.append("algo.kl_controller=adaptive needs algo.kl_placement=reward or loss")
    if cfg.critic.init == "prm" and not (cfg.critic.path or cfg.reward.prm_path):
        problems.append("critic.init=prm needs reward.prm_path=DIR or critic.path=DIR (`reasonrl rm train --kind prm`)")
    elif cfg.critic.init not in ("policy", "prm") and not cfg.critic.path:
        problems.append(f"critic.init={cfg.critic.init} needs critic.path=DIR (a saved critic or reward model)")
    if cfg.reward.prm_dense != "off" and not cfg.reward.prm_path:
        problems.append(f"reward.prm_dense={cfg.reward.prm_dense} needs reward.prm_path=DIR (`rm train --kind prm`)")
    if cfg.critic.init == "policy" and cfg.critic.path:
        problems.append("critic.path is set but critic.init is 'policy'; set critic.init=checkpoint or reward_model")
    return problems


SHIPPED_ENVIRONMENTS = ("countdown", "guess_number", "python")


def _environment(cfg: Config) -> list[str]:
    """An environment rollout's settings (the class itself is loaded when the run starts)."""
    r, problems = cfg.rollout, []
    game = r.environment in ("countdown", "guess_number") and r.multiturn == "env"
    built_in = not any(mark in cfg.data.dataset for mark in "./")  # not a file, not a hub id
    if game and built_in and cfg.data.dataset != r.environment:
        problems.append(
            f"rollout.environment={r.environment} plays the rows of its own dataset: set data.dataset={r.environment} "
            "(or a file of such rows)"
        )
    if r.multiturn == "env":
        name = r.environment or ""
        target, sep, attribute = name.rpartition(":")
        if name not in SHIPPED_ENVIRONMENTS and not (sep and target.strip() and attribute.strip()):
            setting = f"rollout.environment={name} must be" if name else "rollout.multiturn=env needs an environment:"
            problems.append(
                f"{setting} one of {', '.join(SHIPPED_ENVIRONMENTS)}, a class of yours as 'module:Class' or "
                "'path/to/file.py:Class', or an OpenEnv server as 'openenv:<url>'"
            )
        if r.max_turns < 1 or r.max_tool_calls < 0:
            problems.append("rollout.max_turns must be >= 1 and rollout.max_tool_calls >= 0 with rollout.multiturn=env")
    if r.environment_timeout_seconds <= r.tool_batch_timeout_seconds:
        problems.append(
            f"rollout.environment_timeout_seconds={r.environment_timeout_seconds:g} must be more than "
            f"rollout.tool_batch_timeout_seconds={r.tool_batch_timeout_seconds:g}: a turn's tool calls finish within it"
        )
    return problems


def _reward_routes(cfg: Config) -> list[str]:
    from reasonrl.config.routes import RoutingError, resolve_routes  # the routing table's own rules

    try:
        resolve_routes(cfg.reward.routes)
    except RoutingError as exc:
        return [str(exc) if "reward.routes" in str(exc) else f"reward.routes: {exc}"]
    return []


def _reward_functions(cfg: Config) -> list[str]:
    functions, weights = cfg.reward.functions, cfg.reward.weights
    problems = []
    if weights and len(weights) != len(functions):
        problems.append(
            f"reward.weights has {len(weights)} entries for {len(functions)} reward.functions; give one per "
            "function, or none for weight 1 each"
        )
    for spec in functions:
        target, sep, name = spec.rpartition(":")
        if spec.strip() != "verifier" and not (sep and target.strip() and name.strip()):
            problems.append(
                f"reward.functions entry {spec!r} is not 'module:function' or 'path/to/file.py:function' "
                "(or 'verifier' for the built-in scorer)"
            )
    return problems


def _offline(cfg: Config) -> list[str]:
    a, t = cfg.algo, cfg.train
    problems = []
    if a.offline != "none" and not cfg.data.offline_path:
        problems.append(
            f"algo.offline={a.offline} trains from an offline dataset: set data.offline_path=FILE "
            "(write one with `reasonrl data sample --out FILE`)"
        )
    if a.offline == "none" and cfg.data.offline_path:
        problems.append("data.offline_path is set but algo.offline is none; use the dpo or dqo preset (algo.offline)")
    if a.offline == "dpo" and t.minibatch_sequences % 2:
        problems.append(
            f"train.minibatch_sequences={t.minibatch_sequences} must be even with algo.offline=dpo (a chosen and "
            "a rejected response per pair)"
        )
    checks = [
        (a.offline_beta > 0, "algo.offline_beta must be > 0"),
        (0 <= a.dqo_lambda <= 1, "algo.dqo_lambda must be in [0, 1]"),
        (a.dqo_weight_clip is None or a.dqo_weight_clip > 0, "algo.dqo_weight_clip must be > 0 (or null)"),
    ]
    return problems + [message for ok, message in checks if not ok]


def _asynchronous(cfg: Config) -> list[str]:
    """What rollout.max_staleness ≥ 1 composes with, and the corrections' settings."""
    a, r = cfg.algo, cfg.rollout
    problems = []
    if a.rollout_correction_threshold is not None and a.rollout_correction_threshold <= 1:
        problems.append(f"algo.rollout_correction_threshold={a.rollout_correction_threshold:g} must be above 1")
    if a.rollout_correction == "decoupled" and a.rollout_correction_level == "sequence":
        problems.append("algo.rollout_correction=decoupled weights tokens: use algo.rollout_correction_level=token")
    if r.max_staleness < 0 or r.producer_threads < 1 or r.producer_timeout_seconds <= 0:
        problems.append("rollout.max_staleness must be >= 0, rollout.producer_threads >= 1 and "
                        "rollout.producer_timeout_seconds > 0")  # fmt: skip
    if r.partial_window_tokens is not None and r.partial_window_tokens < 1:
        problems.append(f"rollout.partial_window_tokens={r.partial_window_tokens} must be >= 1")
    if r.max_staleness < 1:
        if r.partial_rollouts:
            problems.append(
                "rollout.partial_rollouts continues responses under weights published while they generate, "
                "which needs rollout.max_staleness >= 1 (a synchronous run does the same within a step with "
                "T-PPO's algo.window_tokens)"
            )
        return problems
    if data_parallel_size(cfg) > 1 and r.producer_timeout_seconds > cfg.dist.worker_timeout_seconds:
        problems.append(
            f"rollout.producer_timeout_seconds={r.producer_timeout_seconds:g} exceeds dist.worker_timeout_seconds="
            f"{cfg.dist.worker_timeout_seconds:g}: the other ranks' wait for rank 0's batch would time out first "
            "without saying why"
        )
    return problems


def _run_name(cfg: Config) -> list[str]:
    """``run.name`` is one directory inside ``run.output_dir``, the only place a run writes or removes files."""
    name = cfg.run.name
    if name is None or ("/" not in name and name not in (".", "..")):
        return []
    return [
        f"run.name={name!r} must be one directory name inside run.output_dir (no '/', not '.' or '..'); "
        "for runs elsewhere set run.output_dir"
    ]


def validate(cfg: Config) -> None:
    """Raise ConfigError listing every problem of ``cfg`` (nothing heavy is imported or loaded)."""
    problems = (
        non_finite_settings(cfg)
        + _ranges(cfg)
        + _run_name(cfg)
        + _batch_sizes(cfg)
        + _algorithm(cfg)
        + _reward_routes(cfg)
        + _reward_functions(cfg)
        + _distributed(cfg)
        + _offline(cfg)
        + _asynchronous(cfg)
        + not_run_together(cfg, RunFacts())
    )
    if problems:
        raise listing(problems)
