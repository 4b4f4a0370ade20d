"""Every combination of modes reasonrl refuses, in one table (``NOT_RUN_TOGETHER``): a new mode adds its rows
here.  ``validate`` checks the settings alone; a run's setup checks them again with what only it knows
(``RunFacts``: a vision-language policy, an engine object given to the run)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.config.config_error import listing
from reasonrl.config.schema import Config


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
