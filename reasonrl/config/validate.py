"""Cross-field checks that run before anything heavy loads, and ``NOT_RUN_TOGETHER``: every combination of modes
reasonrl refuses, in one table (a new mode adds its rows there).  Single settings' ranges are ``config/ranges.py``'s.

Every problem is reported at once, each with the keys involved and a way to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.config.config_error import listing
from reasonrl.config.ranges import non_finite_settings, range_problems
from reasonrl.config.schema import Config


def _divisors_near(n: int, target: int, count: int = 3) -> list[int]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return sorted(sorted(divisors, key=lambda d: abs(d - target))[:count])


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
    if isinstance(t.microbatch_tokens, int) and t.microbatch_tokens < longest:
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


def data_parallel_size(cfg: Config) -> int:
    """How many data-parallel trainer ranks the run has: dist.trainer_workers with Ray, the torchrun
    world size (WORLD_SIZE) with torch (or auto under torchrun), else 1."""
    backend = cfg.dist.backend
    if backend == "ray":
        return cfg.dist.trainer_workers
    if backend in ("torch", "auto"):
        return int(os.environ.get("WORLD_SIZE", "1"))
    return 1


@dataclass(frozen=True)
class RunFacts:
    """What decides whether settings run together beyond the settings themselves, known once a run starts
    (``setup``); ``validate`` checks the settings alone, with these at their defaults."""

    vision_language: bool = False
    """The policy is a vision-language model (known from its config)."""
    engine_given: bool = False
    """The run was given an engine object (the Python API, tests) rather than building one from the settings."""


@dataclass(frozen=True)
class NotRunTogether:
    """A combination reasonrl does not run: ``first`` with ``second``, refused with ``fix`` (what to change and
    why) wherever ``combined`` holds."""

    first: str
    second: str
    combined: Callable[[Config, RunFacts], bool]
    fix: str

    def message(self) -> str:
        return f"{self.first} does not run with {self.second}: {self.fix}"


def _async(cfg: Config) -> bool:
    return cfg.rollout.max_staleness >= 1


def _multiturn(cfg: Config) -> bool:
    return cfg.rollout.multiturn != "none"


def _tppo(cfg: Config) -> bool:
    return cfg.algo.window_tokens is not None


VLM = "a vision-language model"
VLM_FIX = "train it with single-turn rollouts, full fine-tuning, in one process (not supported yet)"
NOT_RUN_TOGETHER: tuple[NotRunTogether, ...] = (
    # T-PPO's truncated rollouts continue responses across steps
    NotRunTogether("algo.window_tokens (T-PPO)", "algo.dynamic_sampling",
                   lambda c, _: _tppo(c) and c.algo.dynamic_sampling,
                   "dynamic sampling regenerates whole groups, which truncated rollouts never wait for; "
                   "set algo.dynamic_sampling=false"),
    NotRunTogether("algo.window_tokens (T-PPO)", "rollout.fire", lambda c, _: _tppo(c) and c.rollout.fire.enabled,
                   "FIRE samples fixed response positions in one call, but truncated rollouts continue responses "
                   "across calls; set rollout.fire.enabled=false"),
    # multi-turn conversations
    NotRunTogether("rollout.multiturn", "algo.window_tokens (T-PPO)", lambda c, _: _multiturn(c) and _tppo(c),
                   "turn one off"),
    NotRunTogether("rollout.multiturn", "algo.dynamic_sampling",
                   lambda c, _: _multiturn(c) and c.algo.dynamic_sampling, "turn one off"),
    NotRunTogether("rollout.multiturn", "rollout.fire", lambda c, _: _multiturn(c) and c.rollout.fire.enabled,
                   "turn one off"),
    NotRunTogether("rollout.multiturn", "algo.overlong=soft",
                   lambda c, _: _multiturn(c) and c.algo.overlong == "soft",
                   "the soft penalty is per single-turn response; turn one off"),
    # dense process rewards score whole single-turn responses
    NotRunTogether("reward.prm_dense", "rollout.multiturn",
                   lambda c, _: c.reward.prm_dense != "off" and _multiturn(c),
                   "it scores whole single-turn responses; turn one off"),
    NotRunTogether("reward.prm_dense", "algo.window_tokens (T-PPO)",
                   lambda c, _: c.reward.prm_dense != "off" and _tppo(c),
                   "it scores whole responses, not windows; turn one off"),
    # offline data and precision
    NotRunTogether("algo.offline", "data parallelism (torchrun or Ray trainers)",
                   lambda c, _: c.algo.offline != "none" and data_parallel_size(c) > 1,
                   "an offline run trains in one process; run it without torchrun or Ray trainers"),
    NotRunTogether("train.param_dtype=bfloat16", "model.dtype=float32",
                   lambda c, _: c.train.param_dtype == "bfloat16" and c.model.dtype == "float32",
                   "bf16 trained weights cannot run float32 forward passes; set model.dtype=bfloat16 (or auto), "
                   "or train.param_dtype=float32"),
    # the asynchronous producer (rollout.max_staleness >= 1; docs/async.md)
    NotRunTogether("rollout.max_staleness>=1 with rollout.partial_rollouts", "algo.window_tokens (T-PPO)",
                   lambda c, _: _async(c) and c.rollout.partial_rollouts and _tppo(c),
                   "T-PPO's windows already continue responses under the weights of the steps after (not yet)"),
    NotRunTogether("rollout.max_staleness>=1 with rollout.partial_rollouts", "rollout.multiturn",
                   lambda c, _: _async(c) and c.rollout.partial_rollouts and _multiturn(c),
                   "a conversation's turns do not keep each token's policy version (not yet)"),
    NotRunTogether("rollout.max_staleness>=1", "algo.offline", lambda c, _: _async(c) and c.algo.offline != "none",
                   "an offline run generates nothing"),
    NotRunTogether("rollout.max_staleness>=1", "reward.prm_dense",
                   lambda c, _: _async(c) and c.reward.prm_dense != "off",
                   "the process reward model is loaded by the trainer (not yet)"),
    NotRunTogether("rollout.max_staleness>=1", "an engine object given to the run",
                   lambda c, facts: _async(c) and facts.engine_given,
                   "the producer process builds its engine from the config: a run given its own engine object "
                   "runs synchronously (max_staleness=0)"),
    # a vision-language policy
    NotRunTogether(VLM, "rollout.multiturn", lambda c, facts: facts.vision_language and _multiturn(c), VLM_FIX),
    NotRunTogether(VLM, "algo.window_tokens (T-PPO)", lambda c, facts: facts.vision_language and _tppo(c), VLM_FIX),
    NotRunTogether(VLM, "algo.offline", lambda c, facts: facts.vision_language and c.algo.offline != "none",
                   VLM_FIX),
    NotRunTogether(VLM, "model.lora_rank", lambda c, facts: facts.vision_language and bool(c.model.lora_rank),
                   VLM_FIX),
    NotRunTogether(VLM, "data parallelism", lambda c, facts: facts.vision_language and data_parallel_size(c) > 1,
                   VLM_FIX),
    NotRunTogether(VLM, "dist.backend=ray", lambda c, facts: facts.vision_language and c.dist.backend == "ray",
                   VLM_FIX),
    NotRunTogether(VLM, "reward.prm_dense (a text PRM)",
                   lambda c, facts: facts.vision_language and c.reward.prm_dense != "off", VLM_FIX),
    NotRunTogether(VLM, "critic.init=reward_model or prm (a text model)",
                   lambda c, facts: facts.vision_language and c.critic.init in ("reward_model", "prm"), VLM_FIX),
)  # fmt: skip
"""Every combination of modes reasonrl refuses, in one place: a new mode adds its rows here."""


def not_run_together(cfg: Config, facts: RunFacts) -> list[str]:
    """The message of every row of ``NOT_RUN_TOGETHER`` that ``cfg`` (with ``facts``) combines."""
    return [row.message() for row in NOT_RUN_TOGETHER if row.combined(cfg, facts)]


def refuse_not_run_together(cfg: Config, facts: RunFacts) -> None:
    """Raise ConfigError listing what ``cfg`` combines that does not run together, facts of the run included."""
    problems = not_run_together(cfg, facts)
    if problems:
        raise listing(problems)


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
        + range_problems(cfg)
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
