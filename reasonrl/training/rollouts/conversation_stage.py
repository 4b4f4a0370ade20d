"""The multi-turn rollout stage: episodes of an environment -> per-turn rewards -> a RolloutBatch.

``ConversationCollector.collect`` reads top to bottom as PAG's rollout and reward (arXiv 2506.10406, §3, eq 1),
and as any environment's (``rollout.multiturn=tool|env``, docs/environments.md):
1. sample ``rollout_prompts`` prompts, G episodes each, started by the environment (``start_conversations``);
2. generate them turn by turn (``run_conversations``: attempt, verify, revise only after "wrong"; or the
   environment's answers: tool outputs, a game's feedback);
3. score with the task's verifier: PAG every attempt; an environment's episode its final turn, unless the
   environment rewards the end itself (``Environment.finish``);
4. reward every turn on its own last token: PAG an attempt acc_t + α·(acc_t − acc_{t−1}) (the revision
   bonus), a verify turn 1 when its verdict matches the truth of the attempt it judges; an environment's
   episode each turn's own reward and the end's (0 everywhere for an episode the environment failed);
5. stack the conversations: injected tokens are in no loss and cut the GAE chain
   (``algo.gae_mask_mode=reset``), and RoleAdvNorm whitens each role apart (``advantage_norm=role_whiten``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import torch

from reasonrl.algo.pag import pag_attempt_rewards, pag_verify_rewards
from reasonrl.batch import RolloutBatch, TurnLabels, pad_rows
from reasonrl.data.loaders import DataError
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.reward.verifier_protocol import RewardResult
from reasonrl.rollout.multiturn.conversations import (
    INJECTED_TURN_TOKENS,
    ToolRule,
    conversation_tensors,
    run_conversations,
    start_conversations,
)
from reasonrl.rollout.multiturn.environments import Countdown, environment_class
from reasonrl.rollout.multiturn.episodes import ROLE_POLICY, Conversation, Environment, batch_started
from reasonrl.rollout.multiturn.openenv_environments import OPENENV_PREFIX, OpenEnvEnvironment
from reasonrl.rollout.multiturn.pag_rules import DirectRevisionRule, PAGRule, parse_verdict
from reasonrl.rollout.multiturn.tool_calls import ToolOutput, hermes_tool_prompt, native_tool_format, with_tool_prompt
from reasonrl.rollout.multiturn.trl_environments import TRLEnvironment
from reasonrl.timing import timed
from reasonrl.training.rollouts.episode_rewards import EpisodeRewards, EpisodeScore
from reasonrl.training.rollouts.rollout_stage import (
    MAX_SKIPPED_PROMPTS,
    Generated,
    RolloutCollector,
    RolloutStage,
    hash_seed,
)
from reasonrl.training.rollouts.rollout_stats import finished_stats

log = logging.getLogger(__name__)

TOOL_CHECK = "assert 1 == 1"  # the sandbox runs a program against tests; a tool call has none to pass


def sandboxed_python(timeout_s: float, budget_s: float, workers: int | None = None):
    """The python tool: run one turn's programs together in the code sandbox (its isolation and limits; at
    most ``workers`` sandboxes at once, default one per CPU core), each under ``timeout_s`` and all within
    ``budget_s`` (the programs of one call, and of every call made for the same turn by the other episodes'
    steps: counted from when the turn's steps began, ``batch_started``); what each printed, or an error message
    (a crash, a timeout, a flood of output, no budget left) marked failed; never raises."""
    from reasonrl.reward.sandbox import CodeJob, SandboxLimits, SandboxPool

    pool = SandboxPool(workers, SandboxLimits(timeout_s=timeout_s))
    unbuffered = "import sys as _sys\n_sys.stdout.reconfigure(line_buffering=True)\n"

    def run_python(programs: Sequence[str]) -> list[ToolOutput]:
        started = batch_started() or time.monotonic()
        seconds_left = max(0.0, budget_s - (time.monotonic() - started))
        verdicts = pool.run_many([CodeJob(unbuffered + code, TOOL_CHECK) for code in programs], seconds_left)
        return [tool_output(v) for v in verdicts]

    return run_python


def tool_output(verdict) -> ToolOutput:
    """A sandbox verdict as the tool's output: what the program printed, and why it failed if it did."""
    if verdict.status == "passed":
        return ToolOutput(verdict.output)
    return ToolOutput(f"{verdict.output}\nError: {verdict.detail or verdict.status}".lstrip("\n"), failed=True)


def environment_name(rollout) -> str | None:
    """The environment of an environment rollout: ``python`` for ``rollout.multiturn=tool``, else
    ``rollout.environment`` (None for pag, direct and single-turn rollouts)."""
    return "python" if rollout.multiturn == "tool" else rollout.environment


def build_environment(rollout, evaluation: bool = False, reward_functions: Sequence[str] = ()) -> Environment:
    """The environment of ``rollout.multiturn`` (a RolloutConfig): PAG's or its baseline's rule, or the
    environment ``rollout.environment`` names (a shipped one with its settings, or a user's class; a TRL class
    with ``rollout.max_tool_calls``)."""
    if rollout.multiturn == "pag":
        return PAGRule(rollout.max_attempts, revise_unparsed=evaluation)
    if rollout.multiturn == "direct":
        return DirectRevisionRule(rollout.max_attempts)
    name = environment_name(rollout)
    if name == "python":
        tool = sandboxed_python(rollout.tool_timeout_seconds, rollout.tool_batch_timeout_seconds)
        return ToolRule(tool, rollout.max_tool_calls)
    if name == "countdown":
        return Countdown(rollout.max_tool_calls)
    if name is None:
        raise ValueError(f"no multi-turn environment for rollout.multiturn={rollout.multiturn!r}")
    if name.startswith(OPENENV_PREFIX):
        return OpenEnvEnvironment.connect(name, rollout.environment_timeout_seconds)
    environment = environment_class(name)
    if issubclass(environment, TRLEnvironment):
        played = environment(rollout.max_tool_calls, rollout.environment_timeout_seconds, not reward_functions)
        if played.reads_reward_attribute:
            log.info(
                "%s has no get_reward and the run no reward.functions: each episode's reward is its instance's "
                "reward attribute at the end, where it has one (what TRL's reward functions read)",
                name,
            )
        return played
    return environment()


def prompt_tools(rollout, tokenizer) -> list[dict] | None:
    """The function schemas the chat template renders into every prompt: the environment's tools, where the
    template has a tool-call format (else None: ``episode_encoder`` writes them into the system prompt)."""
    name = environment_name(rollout)
    tools = getattr(environment_class(name), "tools", ()) if name is not None else ()
    return list(tools) if tools and native_tool_format(tokenizer) else None


class ToolPromptEncoder(PromptEncoder):
    """The prompts of ``encoder`` with ``tools`` written into each chat's system message, in the Hermes format the
    parser reads (``tool_calls.with_tool_prompt``): for a chat template without a tool-call format, which drops
    ``tools=``."""

    def __init__(self, encoder: PromptEncoder, tools: Sequence[dict]) -> None:
        super().__init__(
            encoder.tokenizer,
            encoder.template,
            encoder.max_prompt_tokens,
            encoder.system_prompt,
            None,
            encoder.processor,
        )
        self.written_tools = list(tools)

    def messages(self, example) -> list[dict[str, str]]:
        return with_tool_prompt(super().messages(example), self.written_tools)


def episode_encoder(encoder: PromptEncoder, tools: Sequence[dict], announce: bool = True) -> PromptEncoder:
    """The prompt encoder of episodes whose environment offers ``tools``: the run's ``encoder``, whose chat template
    renders them where it has a tool-call format (``prompt_tools``); where it has none (SmolLM2's), one that writes
    them and the call into every system message (``ToolPromptEncoder``), unless data.system_prompt is set: that is
    kept as written, to say how to call them itself.  Either fallback is logged (``announce``)."""
    if not tools or native_tool_format(encoder.tokenizer):
        return encoder
    names = ", ".join(tool["function"]["name"] for tool in tools)
    if encoder.system_prompt and not announce:
        return encoder
    if encoder.system_prompt:
        log.info(
            "the chat template has no tool-call format, and data.system_prompt is kept as written: it alone tells "
            'the model how to call the tools (%s); the calls read are <tool_call>{"name": ..., "arguments": '
            "{...}}</tool_call> blocks. Unset data.system_prompt to have the tools written into the system prompt",
            names,
        )
        return encoder
    if not announce:
        return ToolPromptEncoder(encoder, tools)
    tokens = len(encoder.tokenizer(hermes_tool_prompt(tools), add_special_tokens=False)["input_ids"])
    log.info(
        "the chat template has no tool-call format: the tools (%s) and how to call them (<tool_call> blocks) are "
        "written into the system prompt, %d tokens of rollout.max_prompt_tokens",
        names,
        tokens,
    )
    return ToolPromptEncoder(encoder, tools)


def generated_turns(rollout) -> int:
    """Generated turns per conversation at most: attempts and verify turns, answers around python tool calls,
    or an environment's ``rollout.max_turns``."""
    if rollout.multiturn == "tool":
        return rollout.max_tool_calls + 1
    return rollout.max_turns if rollout.multiturn == "env" else 2 * rollout.max_attempts - 1


def conversation_token_cap(rollout) -> int:
    """rollout.max_conversation_tokens, or its default: the generated turns plus 128 tokens per injected turn."""
    turns = generated_turns(rollout)
    if rollout.max_conversation_tokens is not None:
        return rollout.max_conversation_tokens
    return turns * rollout.max_response_tokens + (turns - 1) * INJECTED_TURN_TOKENS


class ConversationCollector(RolloutStage):
    """Produces each step's batch of multi-turn conversations (``rollout.multiturn``), reusing the
    synchronous collector's engine, stream, prompt encoder (``episode_encoder``: with the environment's tools in
    the system prompt where the chat template cannot render them) and scorer."""

    def __init__(self, synchronous: RolloutCollector) -> None:
        self.synchronous, self.alpha = synchronous, synchronous.settings.algo.revision_bonus
        rollout = synchronous.settings.rollout
        reward_functions = synchronous.settings.reward.functions
        self.protocol, self.environment = rollout.multiturn, build_environment(rollout, False, reward_functions)
        self.encoder = episode_encoder(synchronous.encoder, getattr(self.environment, "tools", ()))
        self.max_turns, self.token_cap = generated_turns(rollout), conversation_token_cap(rollout)
        self.timeout_s = rollout.environment_timeout_seconds
        settings = synchronous.settings
        self.end_rewards = EpisodeRewards(settings.reward, synchronous.scorer, settings.rollout_steps)

    @property
    def stream(self) -> TrainingStream:
        """The prompt stream the conversations start from (the synchronous collector's)."""
        return self.synchronous.stream

    def state_dict(self) -> dict:
        return self.synchronous.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.synchronous.load_state_dict(state)

    def collect(self, step: int, seed_step: int | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        c, generated = self.synchronous, Generated()
        # 1. prompts, G episodes each (stream = row: an episode samples the same in any batch)
        rows = [e for e in self.prompts(step) for _ in range(c.group_size)]
        params = c.sampling_params(hash_seed(c.settings.seed, step if seed_step is None else seed_step, 1))
        conversations, flat, results = self.play(rows, params, generated, step)
        generated.check_scoring(step, c.settings.reward.max_error_fraction)
        # 4. per-turn rewards on each turn's last token
        tensors = conversation_tensors(conversations, c.tokenizer.pad_token_id)
        if self.protocol in ("pag", "direct"):
            last_result = {row: r for (row, _), r in zip(flat, results, strict=True)}  # later attempts overwrite
            turn_rewards, stats = self.turn_rewards(conversations, tensors.turn_ends, [r.correct for r in results])
            correct = [last_result[row].correct for row in range(len(conversations))]
        else:
            turn_rewards, correct, stats = self.episode_rewards(conversations, tensors.turn_ends, flat)
        batch = self.batch(conversations, tensors, turn_rewards, correct)
        return batch, {
            **stats,
            **finished_stats(batch, torch.ones(len(batch), dtype=torch.bool), results),
            **generated.stats(),
        }

    def play(
        self, rows: Sequence, params, generated: Generated, step: int = 0
    ) -> tuple[list[Conversation], list, list[RewardResult]]:
        """Episode i on ``rows[i]``, generated and scored (step 1's episodes started, steps 2 and 3 of ``collect``):
        the conversations, then PAG's (row, turn) pairs the verifier read and its results, or an environment's
        ``EpisodeScore`` per episode and their results."""
        c = self.synchronous
        chats = [dataclasses.replace(e, messages=tuple(self.encoder.messages(e))) for e in rows]
        conversations = start_conversations(
            self.environment,
            c.tokenizer,
            chats,
            max_prompt_tokens=self.encoder.max_prompt_tokens,
            timeout_s=self.timeout_s,
        )
        prompt_messages = [len(x.messages) for x in conversations]  # what a reward function's completion follows
        # 2. generate turn by turn
        with timed(generated.timing, "perf/generate_seconds"):
            run_conversations(
                c.engine, c.tokenizer, conversations, self.environment, params,
                max_turns=self.max_turns, max_response_tokens=self.token_cap, timeout_s=self.timeout_s,
            )  # fmt: skip
        generated.calls.append([len(t.token_ids) for x in conversations for t in x.turns()])
        # 3. PAG: the verifier reads every attempt; an environment: its rewards of each episode's end
        with timed(generated.timing, "perf/score_seconds"):
            if self.protocol in ("pag", "direct"):
                flat = [(row, a) for row, x in enumerate(conversations) for a in x.turns(ROLE_POLICY)]
                results = c.scorer.score_examples([rows[row] for row, _ in flat], [a.text for _, a in flat])
            else:
                flat = self.end_rewards.score(rows, conversations, prompt_messages, step)
                results = [score.result for score in flat]
        generated.results += results
        return conversations, flat, results

    def evaluate(self, examples: Sequence, params) -> dict[str, float]:
        """Held-out episodes of an environment (``rollout.multiturn=tool|env``), one per example, sampled with
        ``params`` (greedy): ``eval/accuracy`` the fraction the environment or the verifier counts as solved
        (as ``reward/accuracy`` in training), generated tokens per episode, and the episodes' turns,
        tool calls and failures (``eval/turns_mean``...)."""
        if not examples:  # a dataset with no held-out row scores as the single-turn evaluation does
            return {"eval/accuracy": 0.0, "eval/response_length": 0.0}
        conversations, scores, _ = self.play(examples, params, Generated())
        tensors = conversation_tensors(conversations, self.synchronous.tokenizer.pad_token_id)
        _, correct, stats = self.episode_rewards(conversations, tensors.turn_ends, scores)
        count = max(1, len(conversations))
        return {
            "eval/accuracy": sum(correct) / count,
            "eval/response_length": sum(len(t.token_ids) for x in conversations for t in x.turns()) / count,
            **{key.replace("multiturn/", "eval/"): value for key, value in stats.items()},
        }

    def prompts(self, step: int) -> list:
        """``rollout_prompts`` prompts from the stream, over-long ones skipped (at most MAX_SKIPPED_PROMPTS)."""
        c, wanted = self.synchronous, self.synchronous.settings.rollout.rollout_prompts
        examples: list = []
        for _ in range(MAX_SKIPPED_PROMPTS):
            examples += [e for e in c.stream.take(wanted - len(examples), step) if self.encoder(e) is not None]
            if len(examples) == wanted:
                return examples
        raise DataError(
            f"{MAX_SKIPPED_PROMPTS} draws of prompts left the step short of rollout.rollout_prompts={wanted}: "
            f"nearly every prompt is longer than rollout.max_prompt_tokens={self.encoder.max_prompt_tokens}; raise it"
        )

    def episode_rewards(
        self, conversations: Sequence[Conversation], turn_ends, scores: Sequence[EpisodeScore]
    ) -> tuple[torch.Tensor, list[bool], dict[str, float]]:
        """[B, T] rewards of an environment's episodes, each on its turn's last token: the turn's own reward
        (``Step.reward``), and on the final turn the end's (``EpisodeRewards``: the environment's, the reward
        functions', the verifier's).  An episode the environment failed gets 0 everywhere.  Also each row's
        ``correct`` (the end's verdict) and the episodes' metrics."""
        width = max(1, max(x.response_length for x in conversations))
        rewards = torch.zeros(len(conversations), width)
        correct = []
        for row, (x, score) in enumerate(zip(conversations, scores, strict=True)):
            if x.error:
                correct.append(False)
                continue
            for end, turn_reward in zip(turn_ends[row], x.rewards, strict=True):
                rewards[row, end] += turn_reward
            rewards[row, turn_ends[row][-1]] += score.end_reward
            correct.append(score.correct)
            if not torch.isfinite(rewards[row].sum()):  # turn rewards that add up past float32: this episode fails
                x.fail(f"its rewards {x.rewards} sum past float32's range"[:200])
                rewards[row], correct[-1] = 0.0, False
        count = len(conversations)
        stats = {
            "multiturn/turns_mean": sum(len(x.turns()) for x in conversations) / count,
            "multiturn/tool_calls_mean": sum(x.tool_calls for x in conversations) / count,
            "multiturn/tool_errors_mean": sum(x.tool_errors for x in conversations) / count,
            "multiturn/environment_error_fraction": sum(bool(x.error) for x in conversations) / count,
        }
        return rewards, correct, stats

    def turn_rewards(self, conversations, turn_ends, correct: list[bool]) -> tuple[torch.Tensor, dict[str, float]]:
        """[B, T] rewards at each generated turn's last token (PAG eq 1), and PAG's rollout metrics."""
        most = max(len(x.turns(ROLE_POLICY)) for x in conversations)
        acc = torch.zeros(len(conversations), most)
        attempt_mask = torch.zeros(len(conversations), most, dtype=torch.bool)
        verdicts = torch.zeros(len(conversations), most, dtype=torch.long)
        judged = torch.zeros(len(conversations), most)  # truth of the attempt a verify turn judges
        verify_mask = torch.zeros(len(conversations), most, dtype=torch.bool)
        flat = iter(correct)
        for row, x in enumerate(conversations):
            attempt = -1
            for turn in x.turns():
                if turn.role == ROLE_POLICY:
                    attempt += 1
                    acc[row, attempt], attempt_mask[row, attempt] = float(next(flat)), True
                else:  # ROLE_VERIFIER judges attempt `attempt`
                    verdicts[row, attempt], judged[row, attempt] = parse_verdict(turn.text), acc[row, attempt]
                    verify_mask[row, attempt] = True
        attempt_rewards = pag_attempt_rewards(acc, attempt_mask, self.alpha)  # [B, A]
        verify_rewards = pag_verify_rewards(verdicts, judged, verify_mask)  # [B, A]
        width = max(1, max(x.response_length for x in conversations))
        rewards = torch.zeros(len(conversations), width)
        for row, x in enumerate(conversations):
            attempt = -1
            for turn, end in zip(x.turns(), turn_ends[row], strict=True):
                attempt += turn.role == ROLE_POLICY
                table = attempt_rewards if turn.role == ROLE_POLICY else verify_rewards
                rewards[row, end] = table[row, attempt]
        attempts = attempt_mask.sum(1)
        final = acc[torch.arange(len(acc)), attempts - 1]
        stats = {
            "multiturn/turns_mean": float(sum(len(x.turns()) for x in conversations)) / len(conversations),
            "multiturn/revision_rate": (attempts > 1).float().mean().item(),
            "multiturn/accuracy_t1": acc[:, 0].mean().item(),
            "multiturn/accuracy_final": final.mean().item(),
        }
        if verify_mask.any():
            stats["multiturn/verifier_accuracy"] = verify_rewards[verify_mask].mean().item()
            stats["multiturn/verdict_unparsed_fraction"] = (verdicts[verify_mask] < 0).float().mean().item()
        return rewards, stats

    def batch(self, conversations, tensors, turn_rewards, correct: list[bool]) -> RolloutBatch:
        """The conversations as a RolloutBatch: ``correct`` per row, the sum of its turn rewards its ``rewards``."""
        prompts = [x.prompt_ids for x in conversations]
        width = max(len(p) for p in prompts)
        group = torch.arange(len(conversations)) // self.synchronous.group_size
        truncated = torch.tensor(
            [x.end == "token_limit" or x.turns()[-1].finish_reason == "length" for x in conversations]
        )
        return RolloutBatch(
            prompt_ids=pad_rows(prompts, width, True, torch.long),
            prompt_mask=pad_rows([[1] * len(p) for p in prompts], width, True, torch.bool),
            response_ids=tensors.response_ids,
            response_mask=tensors.response_mask,
            policy_loss_mask=tensors.response_mask.clone(),
            value_loss_mask=tensors.response_mask.clone(),
            rollout_logprobs=tensors.rollout_logprobs,
            rewards=turn_rewards.sum(1),
            correct=torch.tensor(correct),
            truncated=truncated,
            group_ids=group,
            turns=TurnLabels(turn_rewards, tensors.role_ids, tensors.turn_ids),
        )
