"""The rollout stage: prompts -> completions -> scores -> shaped rewards -> a RolloutBatch.

``RolloutCollector`` runs synchronous rollouts: every response runs to its end.  With DAPO dynamic
sampling it over-samples prompts, drops groups whose accuracy (or reward) is constant, regenerates
until enough groups survive (at most ``max_generation_passes``) and trims to exactly
``rollout_prompts`` groups; groups left over are discarded (DAPO Algorithm 1; docs/algorithms.md, ambiguity 31).

``PoolCollector`` runs T-PPO's truncated rollouts: each step advances a ``RolloutPool`` by one
window and trains on every sequence it advanced, finished or not (docs/algorithms.md, T-PPO).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from reasonrl.algo.presets import AlgoSpec
from reasonrl.algo.shaping import nonconstant_group_mask, overlong_penalty
from reasonrl.batch import PoolWindow, PromptImages, RolloutBatch, pad_rows
from reasonrl.config import Config, Plan
from reasonrl.config.schema import RewardConfig, RolloutConfig
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.errors import ReasonRLError
from reasonrl.reward.custom import VERIFIER_TERM
from reasonrl.reward.format import FormatVerifier
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext
from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams
from reasonrl.rollout.sampling import fire_params
from reasonrl.rollout.scored import Scored, sample_and_score
from reasonrl.rollout.tppo_pool import PoolSequence, RolloutPool
from reasonrl.timing import timed
from reasonrl.training.rollouts.process_rewards import all_failed_prompt_stats
from reasonrl.training.rollouts.rollout_stats import finished_stats, fullness_stats, scoring_errors

log = logging.getLogger(__name__)


class RolloutStage(Protocol):
    """Where each step's batch comes from: every way a run produces it implements this (``RolloutCollector``:
    synchronous single-turn rollouts; ``PoolCollector``: T-PPO's windows; ``ConversationCollector``: multi-turn
    episodes; ``AsyncRollouts``: any of them in a producer ahead of the trainer), and
    ``training.rollout_setup.training_rollouts`` is the one place that picks it from the settings.

    Its state is what a checkpoint keeps of it so a resumed run continues exactly: the prompt stream's position
    (``stream``), and T-PPO's sequences in flight (``pool``) where it has them."""

    stream: TrainingStream
    """The prompts it draws from."""

    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Step ``step``'s batch and its rollout metrics."""
        ...

    def state_dict(self) -> dict:
        """What a checkpoint after its latest batch keeps of it."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's ``state_dict``."""
        ...

    def close(self) -> None:
        """Stop what it runs beside this process (the asynchronous producer); nothing by default."""


class DynamicSamplingError(ReasonRLError, RuntimeError):
    """Dynamic sampling could not fill a batch within its generation-pass budget."""


class RewardFailureError(ReasonRLError, RuntimeError):
    """A reward function (or the built-in scorer) failed on too many of a step's calls to train on."""


def build_batch(scored: Scored, rewards: torch.Tensor, group_ids: torch.Tensor, filter_truncated: bool) -> RolloutBatch:
    """Tensors for a scored set of completions (``rewards`` already shaped)."""
    prompts, completions = scored.prompts, scored.completions
    p_width = max(len(p) for p in prompts)
    t_width = max(1, max(len(c.token_ids) for c in completions))
    response_mask = pad_rows([[1] * len(c.token_ids) for c in completions], t_width, False, torch.bool)
    truncated = torch.tensor([c.finish_reason == "length" for c in completions])
    policy_mask = response_mask & ~truncated[:, None] if filter_truncated else response_mask.clone()
    versions = None  # each token's policy version, where the engine tagged them (partial rollouts)
    if any(c.policy_versions is not None for c in completions):
        tags = [c.policy_versions if c.policy_versions is not None else [-1] * len(c.token_ids) for c in completions]
        versions = pad_rows(tags, t_width, False, torch.long, fill=-1)
    return RolloutBatch(
        prompt_ids=pad_rows(prompts, p_width, True, torch.long),
        prompt_mask=pad_rows([[1] * len(p) for p in prompts], p_width, True, torch.bool),
        response_ids=pad_rows([c.token_ids for c in completions], t_width, False, torch.long),
        response_mask=response_mask,
        policy_loss_mask=policy_mask,
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=pad_rows([c.logprobs for c in completions], t_width, False, torch.float32),
        rewards=rewards.to(torch.float32),
        correct=torch.tensor([r.correct for r in scored.results]),
        truncated=truncated,
        group_ids=group_ids,
        policy_versions=versions,
        images=PromptImages.of(prompts),
    )


def refuse_unheld_rewards(scored: Scored, rewards: torch.Tensor, failed_reward: float) -> torch.Tensor:
    """``rewards`` [N] with each row float32 could not hold (a score scaled or shaped past its range) refused as
    a failed scoring call of that row: its result marked with the error (``scored.results`` in place), its
    reward ``failed_reward``.  One inf would turn every advantage of the batch NaN."""
    unheld = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    for row in unheld:
        result = scored.results[row]
        error = f"its shaped reward of score {result.score:g} is beyond float32's range"
        scored.results[row] = RewardResult(0.0, False, {**result.info, "error": error})
    if unheld:
        log.warning("a shaped reward is beyond float32's range (%s): its row fails", scored.results[unheld[0]].info)
        rewards = rewards.clone()
        rewards[unheld] = failed_reward
    return rewards


@dataclass(frozen=True)
class RolloutSettings:
    """What the rollout stages read of a run's config: sampling and turns, reward shaping and group
    filters, the reward scale and error budget, the run's seed, and two counts its plan derives."""

    rollout: RolloutConfig
    algo: AlgoSpec
    reward: RewardConfig
    seed: int
    prompts_per_generation_pass: int
    overlong_cache_tokens: int | None
    rollout_steps: int = 0
    """train.rollout_steps: the run's last step, as reward functions read it (``trainer_state.max_steps``)."""

    @classmethod
    def of(cls, cfg: Config, plan: Plan) -> RolloutSettings:
        seed, per_pass, overlong_cache = cfg.run.seed, plan.prompts_per_generation_pass, plan.overlong_cache_tokens
        return cls(cfg.rollout, cfg.algo, cfg.reward, seed, per_pass, overlong_cache, cfg.train.rollout_steps)


class RolloutCollector(RolloutStage):
    """Produces each step's training batch from the prompt stream."""

    def __init__(
        self,
        settings: RolloutSettings,
        engine: RolloutEngine,
        tokenizer,
        scorer: Scorer,
        stream: TrainingStream,
        encoder: PromptEncoder,
        process_rewards: Callable[[RolloutBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]] | None = None,
    ) -> None:
        self.settings = settings
        self.engine, self.tokenizer, self.scorer = engine, tokenizer, scorer
        self.stream, self.encoder = stream, encoder
        self.process_rewards = process_rewards  # dense line rewards for code rows (reward.prm_dense), or None
        self.format_verifier = FormatVerifier()

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])

    def shaped_rewards(self, scored: Scored) -> tuple[torch.Tensor, dict[str, float]]:
        """Verifier scores mapped to [incorrect_score, correct_score], plus format and overlong terms."""
        reward_cfg, algo = self.settings.reward, self.settings.algo
        scores = torch.tensor([r.score for r in scored.results], dtype=torch.float32)
        rewards = reward_cfg.incorrect_score + (reward_cfg.correct_score - reward_cfg.incorrect_score) * scores
        stats: dict[str, float] = {}
        if reward_cfg.format_weight:
            texts = self.tokenizer.batch_decode([c.token_ids for c in scored.completions], skip_special_tokens=True)
            formats = torch.tensor([self.format_verifier(t, "").score for t in texts])
            rewards = rewards + reward_cfg.format_weight * formats
            stats["reward/format"] = formats.mean().item()
        if algo.overlong == "soft":
            lengths = torch.tensor([len(c.token_ids) for c in scored.completions])
            penalty = overlong_penalty(
                lengths,
                self.settings.rollout.max_response_tokens,
                self.settings.overlong_cache_tokens,
                algo.overlong_penalty_factor,
            ).to(torch.float32)
            rewards = rewards + penalty
            stats["reward/overlong_penalty"] = penalty.mean().item()
        return refuse_unheld_rewards(scored, rewards, reward_cfg.incorrect_score), stats

    def sampling_params(self, seed: int) -> SamplingParams:
        """The run's sampling settings, with this call's seed."""
        rollout = self.settings.rollout
        return SamplingParams(
            max_new_tokens=rollout.max_response_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=seed,
            fire=fire_params(rollout.fire),
        )

    def collect(self, step: int, seed_step: int | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        """This step's batch of ``rollout_prompts`` groups and the rollout metrics.

        ``step`` selects the task-mix phase; the sampler is seeded by (run seed, ``seed_step``, pass),
        ``seed_step`` defaulting to ``step`` (value pretraining passes its own, all at step 0).
        """
        generated = Generated()
        groups = self.fill_groups(step, step if seed_step is None else seed_step, generated)
        scored = Scored.concat([group for group, _ in groups])
        group_ids = torch.arange(len(groups)).repeat_interleave(self.group_size)
        filter_truncated = self.settings.algo.overlong == "filter"
        batch = build_batch(scored, torch.cat([r for _, r in groups]), group_ids, filter_truncated)
        fire = self.settings.rollout.fire
        if fire.enabled and fire.logprob == "mask":
            batch.policy_loss_mask[:, list(fire.positions)] = False  # FIRE tokens: off-policy
        code_rows = torch.tensor([e.task_type == "code" for e in scored.examples])
        if self.process_rewards is not None:
            with timed(generated.timing, "perf/process_reward_seconds"):
                batch.dense_rewards, dense_stats = self.process_rewards(batch, code_rows)
            generated.reward_stats |= dense_stats
        generated.reward_stats |= all_failed_prompt_stats(batch, code_rows)
        stats = {
            **finished_stats(batch, torch.ones(len(batch), dtype=torch.bool), scored.results),
            "rollout/generation_passes": float(len(generated.calls)),
            "rollout/kept_group_fraction": len(groups) / max(1, len(generated.results) // self.group_size),
            **generated.stats(),
        }
        return batch, stats

    @property
    def group_size(self) -> int:
        """G: responses sampled per prompt."""
        return self.settings.rollout.samples_per_prompt

    def fill_groups(self, step: int, seed_step: int, generated: Generated) -> list[tuple[Scored, torch.Tensor]]:
        """Generation passes until ``rollout_prompts`` groups are kept: DAPO's dynamic sampling
        (Algorithm 1, lines 2–7) when ``algo.dynamic_sampling`` is on, else one pass keeps every group.
        Line 3 (π_old ← π_θ) is the weight sync that ended the previous step; lines 8–10 (advantages,
        updates) are the trainer's.

        Returns the first ``rollout_prompts`` kept groups, each with its shaped rewards; the groups a
        last pass kept beyond that number are discarded.  ``generated`` counts every pass.  A reward that
        failed too often over the passes stops the run (``Generated.check_scoring``).
        """
        algo, wanted = self.settings.algo, self.settings.rollout.rollout_prompts
        buffer: list[tuple[Scored, torch.Tensor]] = []
        while len(buffer) < wanted:  # 7: fewer than N groups in the buffer: generate again
            if algo.max_generation_passes and len(generated.calls) >= algo.max_generation_passes:
                generated.check_scoring(step, self.settings.reward.max_error_fraction)  # a broken reward: say so first
                raise DynamicSamplingError(
                    f"dynamic sampling kept {len(buffer)} of {wanted} groups after {len(generated.calls)} "
                    "generation passes: nearly every group was all-correct or all-wrong.  Make the task harder or "
                    "easier (data.arithmetic_digits), raise algo.max_generation_passes, "
                    "or set algo.dynamic_sampling=false"
                )
            # 2: sample a batch of prompts
            examples = self.stream.take(self.settings.prompts_per_generation_pass, step)
            # 4–5: sample G responses per prompt from π_old and score them
            seed = hash_seed(self.settings.seed, seed_step, len(generated.calls) + 1)
            scored = self.generation_pass(examples, seed, generated.timing, step)
            rewards, generated.reward_stats = self.shaped_rewards(scored)
            generated.add(scored)
            # 6: drop the groups whose accuracy is all 0 or all 1 (eq 11); buffer the others
            keep = self.informative(scored, rewards)
            for g in range(len(scored.completions) // self.group_size):
                rows = slice(g * self.group_size, (g + 1) * self.group_size)
                if keep[rows].all():
                    buffer.append((scored.rows(rows), rewards[rows]))
        generated.check_scoring(step, self.settings.reward.max_error_fraction)
        return buffer[:wanted]

    def generation_pass(
        self, examples: Sequence[Example], seed: int, timing: dict[str, float], step: int = 0
    ) -> Scored:
        """G scored responses to each of ``examples`` (over-long prompts skipped) for rollout ``step``; an error if
        none is left.  The seconds spent generating and scoring are added to ``timing``."""
        params, repeats = self.sampling_params(seed), self.group_size
        scored = sample_and_score(
            self.engine, self.tokenizer, self.scorer, self.encoder, examples, params, repeats, timing,
            step, self.settings.rollout_steps,
        )  # fmt: skip
        if not scored.completions:
            raise DataError(
                f"all {len(examples)} prompts of a generation pass are longer than "
                f"rollout.max_prompt_tokens={self.settings.rollout.max_prompt_tokens}; raise it"
            )
        return scored

    def informative(self, scored: Scored, rewards: torch.Tensor) -> torch.Tensor:
        """[N] bool: the rows whose group the dynamic-sampling filter keeps (DAPO eq 11: 0 < #correct < G, or a
        non-constant reward with ``dynamic_sampling_metric=reward``); every row without dynamic sampling."""
        algo = self.settings.algo
        if not algo.dynamic_sampling:
            return torch.ones(len(rewards), dtype=torch.bool)
        group_ids = torch.arange(len(rewards) // self.group_size).repeat_interleave(self.group_size)
        accuracy = torch.tensor([float(r.correct) for r in scored.results])
        return nonconstant_group_mask(accuracy if algo.dynamic_sampling_metric == "acc" else rewards, group_ids)


MAX_SKIPPED_PROMPTS = 1000  # consecutive over-long prompts before the pool gives up


class PoolCollector(RolloutStage):
    """T-PPO's rollout stage (arXiv 2506.15050; docs/algorithms.md, T-PPO): one window of the rollout pool per step.

    The step's batch holds every sequence the window advanced, each with its prompt and its whole
    response so far.  Masks (the paper's token filtering; docs/algorithms.md, ambiguity 20):
      - ``policy_loss_mask``: the tokens generated in this window (``algo.policy_tokens=window``),
        so each token is trained on once, by the policy that sampled it; or every generated token
        (``all_generated``);
      - ``value_loss_mask``: every response token of the sequences that finished, none of the running
        ones (``pool_window.running``), whose return is not known yet;
      - ``pool_window.stale_mask``: tokens from earlier windows, whose behaviour log-probs were stored when
        they were sampled (``rollout_logprobs``) and serve as their old log-probs.
    Finished sequences are scored and shaped like synchronous ones; running ones get reward 0 (their
    advantages come from EGAE's bootstrap).  It reuses the synchronous collector's parts: engine,
    stream, prompt encoder, scorer and reward shaping.
    """

    def __init__(
        self, synchronous: RolloutCollector, pool: RolloutPool, sampling_version: Callable[[int], int] | None = None
    ) -> None:
        self.synchronous, self.pool = synchronous, pool
        # the policy version step s's window samples with: s − 1 in the synchronous loop; in an asynchronous
        # run's producer, the version its engine holds
        self.sampling_version = sampling_version or (lambda step: step - 1)

    @property
    def stream(self) -> TrainingStream:
        """The prompt stream the pool admits prompts from (the synchronous collector's)."""
        return self.synchronous.stream

    def state_dict(self) -> dict:
        return {**self.synchronous.state_dict(), "pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.synchronous.load_state_dict(state)
        self.pool.load_state_dict(state["pool"])

    def _new_group(self, step: int):
        collector = self.synchronous

        def new_group(index: int) -> list[PoolSequence]:
            for _ in range(MAX_SKIPPED_PROMPTS):
                example = collector.stream.take(1, step)[0]
                prompt = collector.encoder(example)
                if prompt is not None:
                    return [PoolSequence(example, prompt, index) for _ in range(collector.group_size)]
            raise DataError(
                f"{MAX_SKIPPED_PROMPTS} prompts in a row are longer than rollout.max_prompt_tokens="
                f"{collector.settings.rollout.max_prompt_tokens}; raise it"
            )

        return new_group

    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Refill the pool, advance it one window, score what finished; returns the batch and its metrics."""
        collector, generated = self.synchronous, Generated()
        refilled = self.pool.refill(self._new_group(step))
        occupied = len(self.pool.active)
        params = collector.sampling_params(hash_seed(collector.settings.seed, step, 1))
        with timed(generated.timing, "perf/generate_seconds"):
            window = self.pool.advance(collector.engine, params, self.sampling_version(step))
        sequences = window.sequences
        finished = [i for i, s in enumerate(sequences) if not s.running]
        completions = [Completion(s.token_ids, s.logprobs, s.finish_reason or "length", s.versions) for s in sequences]
        scored = Scored(
            [sequences[i].example for i in finished],
            [sequences[i].prompt_ids for i in finished],
            [completions[i] for i in finished],
            [],
        )
        with timed(generated.timing, "perf/score_seconds"):
            texts = collector.tokenizer.batch_decode(
                [c.token_ids for c in scored.completions], skip_special_tokens=True
            )
            context = ScoringContext(
                tuple(tuple(c.token_ids) for c in scored.completions), step, collector.settings.rollout_steps
            )
            scored.results = collector.scorer.score_examples(scored.examples, texts, context) if finished else []
        rewards = torch.zeros(len(sequences))
        results = [RewardResult(0.0, False) for _ in sequences]
        if finished:
            rewards[finished], generated.reward_stats = collector.shaped_rewards(scored)
            for i, result in zip(finished, scored.results, strict=True):
                results[i] = result
        generated.calls, generated.results = [window.new_tokens], scored.results
        generated.check_scoring(step, collector.settings.reward.max_error_fraction)
        every = Scored([s.example for s in sequences], [s.prompt_ids for s in sequences], completions, results)
        batch = self.pooled_batch(sequences, every, rewards)
        stats = {
            **finished_stats(batch, ~batch.pool_window.running, scored.results),
            "rollout/finished_sequences": float(len(finished)),
            "rollout/running_sequences": float(len(sequences) - len(finished)),
            "rollout/pool_fill": occupied / self.pool.slots,
            "rollout/refilled_sequences": float(refilled),
            "rollout/reprefill_tokens": float(window.reprefill_tokens),
            "rollout/windows_per_response": (
                sum(sequences[i].windows for i in finished) / len(finished) if finished else float("nan")
            ),
            **generated.stats(),
        }
        return batch, stats

    def pooled_batch(self, sequences: Sequence[PoolSequence], scored: Scored, rewards: torch.Tensor) -> RolloutBatch:
        """The batch of every sequence a window advanced, with the masks of T-PPO's token filtering."""
        algo = self.synchronous.settings.algo
        _, group_ids = torch.unique(torch.tensor([s.group for s in sequences]), return_inverse=True)
        batch = build_batch(scored, rewards, group_ids, filter_truncated=False)  # running rows are no truncations
        running = torch.tensor([s.running for s in sequences])
        width = batch.response_mask.shape[1]
        stale = pad_rows([[1] * s.window_start for s in sequences], width, False, torch.bool)
        batch.pool_window = PoolWindow(running, stale)
        batch.truncated = torch.tensor([s.finish_reason == "length" for s in sequences])
        if algo.policy_tokens == "window":
            batch.policy_loss_mask &= ~stale
        if algo.overlong == "filter":
            batch.policy_loss_mask &= ~batch.truncated[:, None]
        batch.value_loss_mask &= ~running[:, None]
        return batch


@dataclass
class Generated:
    """What the engine generated in one rollout step, discarded groups included: what the generation
    metrics count."""

    calls: list[list[int]] = field(default_factory=list)
    """Tokens per completion, per engine call (one call per generation pass, or per pool window)."""

    results: list[RewardResult] = field(default_factory=list)
    """The verdict of every scored response."""

    reward_stats: dict[str, float] = field(default_factory=dict)
    """Means of the reward-shaping terms (format, overlong penalty, process rewards) over the last scored
    responses."""

    timing: dict[str, float] = field(default_factory=dict)
    """Seconds spent generating (``perf/generate_seconds``) and scoring (``perf/score_seconds``)."""

    def add(self, scored: Scored) -> None:
        """Count one generation pass."""
        self.calls.append([len(c.token_ids) for c in scored.completions])
        self.results += scored.results

    def check_scoring(self, step: int, max_error_fraction: float) -> None:
        """Stop the run (RewardFailureError, one line) when a reward function, or the built-in scorer, failed
        on at least ``max_error_fraction`` of this step's scoring calls: training on its zeros would only
        look like training.  Its first failure's traceback was logged by its scoring pool."""
        calls = len(self.results)
        for name, errors in scoring_errors(self.results).items():
            share = len(errors) / max(1, calls)
            if errors and share >= max_error_fraction:
                scorer = "the built-in scorer" if name in (None, VERIFIER_TERM) else f"reward function '{name}'"
                failed = f"all {calls} calls" if share == 1 else f"{len(errors)} of {calls} calls"
                limit = "" if share == 1 else f", {share:.0%} >= reward.max_error_fraction={max_error_fraction:g}"
                raise RewardFailureError(
                    f"{scorer} failed on {failed} at step {step}{limit} (first: {errors[0]}; logged above); "
                    "the run stopped rather than train on its zeros"
                )

    def stats(self) -> dict[str, float]:
        """Error share of the scored responses and each function's failed calls, tokens generated, how full
        the engine's batch stayed, timing."""
        errors = scoring_errors(self.results)
        return {
            "reward/error_fraction": sum("error" in r.info for r in self.results) / max(1, len(self.results)),
            **{f"reward/fn/{name}/errors": float(len(e)) for name, e in errors.items() if name is not None},
            "rollout/tokens_generated": float(sum(map(sum, self.calls))),
            **fullness_stats(self.calls),
            **self.reward_stats,
            **self.timing,
        }


def hash_seed(*parts: int) -> int:
    """A 31-bit seed derived from integers (run seed, step, pass): reproducible across processes."""
    value = 0x9E3779B9
    for part in parts:
        value = (value * 1_000_003 + part + 0x7F4A7C15) % (2**61 - 1)
    return value % (2**31 - 1)
