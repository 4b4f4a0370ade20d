"""What a run reads before any model loads, and what plugs into it: the data settings (``data_spec``), the prompts
as the policy reads them (``prompt_encoder``, measured by ``check_prompts``), the user's plug-ins checked up front
(``preflight``: trackers, reward functions, the environment) and the scorer of the responses (``build_scorer``)."""

from __future__ import annotations

import logging

import torch

from reasonrl.config import Config, ConfigError
from reasonrl.data.loaders import Fields
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import DataSpec, TrainingStream, check_held_out, check_prompt_lengths
from reasonrl.reward.custom import RewardFunctionError, RewardTerm, WeightedRewards, reward_terms
from reasonrl.reward.router import build_router
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.reward.verifier_protocol import Scorer, Verifier
from reasonrl.rollout.multiturn.environments import EnvironmentLoadError, environment_class
from reasonrl.rollout.multiturn.openenv_environments import OPENENV_PREFIX
from reasonrl.training.record.trackers import TrackerError, check_trackers
from reasonrl.training.rollouts.conversation_stage import environment_name, episode_encoder, prompt_tools

log = logging.getLogger(__name__)


def data_spec(cfg: Config) -> DataSpec:
    """The data settings of a config."""
    d = cfg.data
    return DataSpec(
        d.dataset,
        d.eval_dataset,
        d.arithmetic_digits,
        d.arithmetic_operations,
        Fields(d.question_field, d.answer_field, answer_optional=cfg.rollout.multiturn == "env"),
        d.task_mix,
    )


def preflight(cfg: Config) -> list[RewardTerm]:
    """What the user plugs in, checked before any model loads: the trackers' packages, the terms of
    ``reward.functions`` (each function imported once) and the environment a run names (its class imported, a
    TRL factory's tools described); a problem is a ConfigError of one line."""
    try:
        check_trackers(cfg.run.loggers)
        terms = reward_terms(cfg.reward.functions, cfg.reward.weights)
        name = environment_name(cfg.rollout)
        if name is not None and not name.startswith(OPENENV_PREFIX):  # an OpenEnv server is asked when it connects
            environment_class(name)
        return terms
    except (RewardFunctionError, TrackerError, EnvironmentLoadError) as exc:
        raise ConfigError(str(exc)) from None


def check_prompts(cfg: Config, stream: TrainingStream, encoder: PromptEncoder) -> None:
    """Before any model loads: refuse a run whose first training prompts are mostly longer than
    rollout.max_prompt_tokens (a DataError naming the value that fits them), warn when some are, and say when
    the held-out evaluation has fewer prompts than data.eval_prompts (a warning when it has none)."""
    if cfg.algo.offline == "none" and (warning := check_prompt_lengths(stream, encoder)):
        log.warning("%s", warning)
    if (held_out := check_held_out(data_spec(cfg), cfg.data.eval_prompts, encoder)) is not None:
        empty, line = held_out
        log.log(logging.WARNING if empty else logging.INFO, "%s", line)


def checked_encoder(cfg: Config, encoder: PromptEncoder) -> PromptEncoder:
    """The encoder whose prompts ``check_prompts`` measures: an environment run's, with the environment's tools
    written into the system prompt where the chat template cannot render them (``episode_encoder``: the episodes'
    prompts; an OpenEnv server's tools are known once it is asked, so its prompts are measured without them)."""
    name = environment_name(cfg.rollout)
    if name is None or name.startswith(OPENENV_PREFIX):
        return encoder
    return episode_encoder(encoder, getattr(environment_class(name), "tools", ()), announce=False)


def build_scorer(
    cfg: Config,
    dtype: torch.dtype,
    device: torch.device,
    verifier: Verifier | None = None,
    terms: list[RewardTerm] | None = None,
) -> Scorer:
    """What scores the responses: a user's ``verifier`` for every task, else the reward router of
    ``cfg``, and with ``reward.functions`` (``terms``) their weighted sum, that scorer as the "verifier" term
    (an environment's episodes call their reward functions themselves, with the episodes' environments:
    ``training.rollouts.episode_rewards``)."""
    if verifier is not None:
        scorer: Scorer = ScoringPool(verifier, cfg.reward.workers, cfg.reward.timeout_seconds)
    else:
        scorer = build_router(cfg.reward, cfg.model.name_or_path, dtype, device)
    if terms and cfg.rollout.multiturn not in ("env", "tool"):
        scorer = WeightedRewards(terms, scorer, workers=cfg.reward.workers, timeout=cfg.reward.timeout_seconds)
    return scorer


def prompt_encoder(cfg: Config, tokenizer, processor=None) -> PromptEncoder:
    """Prompts as the policy reads them: the template, the token cap, the system prompt, the tools."""
    tools = prompt_tools(cfg.rollout, tokenizer)
    return PromptEncoder(
        tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens, cfg.data.system_prompt, tools, processor
    )
