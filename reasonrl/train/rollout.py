"""The rollout stage: prompts -> completions -> scores -> shaped rewards -> a RolloutBatch.

``RolloutCollector`` runs synchronous rollouts: every response runs to its end.  With DAPO dynamic
sampling it over-samples prompts, drops groups whose accuracy (or reward) is constant, regenerates
until enough groups survive (at most ``max_generation_passes``) and trims to exactly
``rollout_prompts`` groups; groups left over are discarded (DAPO Algorithm 1; spec §2 (e)7).

``PoolCollector`` runs T-PPO's truncated rollouts: each step advances a ``RolloutPool`` by one
window and trains on every sequence it advanced, finished or not (spec §5 (b)).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reasonrl.algo.shaping import nonconstant_group_mask, overlong_penalty
from reasonrl.batch import RolloutBatch, pad_rows
from reasonrl.config import Config, Plan
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError
from reasonrl.data.prompts import chat_token_ids, prompt_messages
from reasonrl.data.source import TrainingStream
from reasonrl.reward.base import RewardResult, Scorer
from reasonrl.reward.format import FormatVerifier
from reasonrl.rollout.base import Completion, RolloutEngine, SamplingParams
from reasonrl.rollout.pool import PoolSequence, RolloutPool, slot_utilisation
from reasonrl.rollout.sampling import FireParams

log = logging.getLogger(__name__)


class DynamicSamplingError(RuntimeError):
    """Dynamic sampling could not fill a batch within its generation-pass budget."""


@dataclass
class Scored:
    """Completions of some prompts, with their verdicts."""

    examples: list[Example]  # one per completion
    prompts: list[list[int]]
    completions: list[Completion]
    results: list[RewardResult]
    generate_seconds: float = 0.0
    score_seconds: float = 0.0


class PromptEncoder:
    """Chat-formatted prompt ids per example, cached; over-long prompts are reported, never cut."""

    def __init__(self, tokenizer, template: str, max_prompt_tokens: int, system_prompt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self._cache: dict[str, list[int]] = {}
        self.too_long = 0

    def __call__(self, example: Example) -> list[int] | None:
        """The prompt ids, or None (with a warning) when the prompt is longer than ``max_prompt_tokens``."""
        if example.id not in self._cache:
            # the template asks for a parseable final answer: math only (code and chat questions carry their own)
            template = self.template if example.task_type == "math" else "plain"
            ids = chat_token_ids(self.tokenizer, prompt_messages(example, template, self.system_prompt))
            self._cache[example.id] = ids
            if len(ids) > self.max_prompt_tokens:
                self.too_long += 1
                log.warning(
                    "skipping prompt %s: %d tokens > rollout.max_prompt_tokens=%d (%d skipped so far)",
                    example.id,
                    len(ids),
                    self.max_prompt_tokens,
                    self.too_long,
                )
        ids = self._cache[example.id]
        return ids if len(ids) <= self.max_prompt_tokens else None


def sample_and_score(
    engine: RolloutEngine,
    tokenizer,
    pool: Scorer,
    encoder: PromptEncoder,
    examples: Sequence[Example],
    params: SamplingParams,
    repeats: int = 1,
) -> Scored:
    """Generate ``repeats`` completions per example (consecutive) and score them."""
    kept = [e for e in examples if encoder(e) is not None]
    expanded = [e for e in kept for _ in range(repeats)]
    prompts = [encoder(e) for e in expanded]
    start = time.perf_counter()
    completions = engine.generate(prompts, params) if prompts else []
    generated = time.perf_counter()
    texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    results = pool.score_examples(expanded, texts)
    scored_at = time.perf_counter()
    return Scored(expanded, prompts, completions, results, generated - start, scored_at - generated)  # type: ignore[arg-type]


def build_batch(scored: Scored, rewards: torch.Tensor, group_ids: torch.Tensor, filter_truncated: bool) -> RolloutBatch:
    """Tensors for a scored set of completions (``rewards`` already shaped)."""
    prompts, completions = scored.prompts, scored.completions
    p_width = max(len(p) for p in prompts)
    t_width = max(1, max(len(c.token_ids) for c in completions))
    response_mask = pad_rows([[1] * len(c.token_ids) for c in completions], t_width, False, torch.bool)
    truncated = torch.tensor([c.finish_reason == "length" for c in completions])
    policy_mask = response_mask & ~truncated[:, None] if filter_truncated else response_mask.clone()
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
    )


class RolloutCollector:
    """Produces each step's training batch from the prompt stream."""

    def __init__(
        self,
        cfg: Config,
        plan: Plan,
        engine: RolloutEngine,
        tokenizer,
        pool: Scorer,
        stream: TrainingStream,
        encoder: PromptEncoder,
    ) -> None:
        self.cfg, self.plan = cfg, plan
        self.engine, self.tokenizer, self.pool = engine, tokenizer, pool
        self.stream, self.encoder = stream, encoder
        self.format_verifier = FormatVerifier()

    def shaped_rewards(self, scored: Scored) -> tuple[torch.Tensor, dict[str, float]]:
        """Verifier scores mapped to [incorrect_score, correct_score], plus format and overlong terms."""
        reward_cfg, algo = self.cfg.reward, self.cfg.algo
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
                self.cfg.rollout.max_response_tokens,
                self.plan.overlong_cache_tokens,
                algo.overlong_penalty_factor,
            ).to(torch.float32)
            rewards = rewards + penalty
            stats["reward/overlong_penalty"] = penalty.mean().item()
        return rewards, stats

    def sampling_params(self, seed: int) -> SamplingParams:
        """The run's sampling settings, with this call's seed."""
        rollout = self.cfg.rollout
        return SamplingParams(
            max_new_tokens=rollout.max_response_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=seed,
            fire=fire_params(self.cfg),
        )

    def collect(self, step: int, seed_step: int | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        """This step's batch of ``rollout_prompts`` groups and the rollout metrics.

        ``step`` selects the task-mix phase; the sampler is seeded by (run seed, ``seed_step``, pass),
        ``seed_step`` defaulting to ``step`` (value pretraining passes its own, all at step 0).
        """
        seed_step = step if seed_step is None else seed_step
        cfg, algo, rollout = self.cfg, self.cfg.algo, self.cfg.rollout
        group_size = rollout.samples_per_prompt
        kept: list[tuple[Scored, torch.Tensor]] = []  # (one group, its rewards)
        kept_groups = generated_groups = passes = 0
        timing = {"perf/generate_seconds": 0.0, "perf/score_seconds": 0.0}
        tokens = errors = 0
        generation_calls: list[list[int]] = []  # tokens per completion, per engine call
        reward_stats: dict[str, float] = {}
        while kept_groups < rollout.rollout_prompts:
            if algo.max_generation_passes and passes >= algo.max_generation_passes:
                raise DynamicSamplingError(
                    f"dynamic sampling kept {kept_groups} of {rollout.rollout_prompts} groups after {passes} "
                    "generation passes: nearly every group was all-correct or all-wrong.  Make the task harder or "
                    "easier (data.arithmetic_digits), raise algo.max_generation_passes, "
                    "or set algo.dynamic_sampling=false"
                )
            passes += 1
            examples = self.stream.take(self.plan.prompts_per_generation_pass, step)
            params = self.sampling_params(hash_seed(cfg.run.seed, seed_step, passes))
            scored = sample_and_score(
                self.engine, self.tokenizer, self.pool, self.encoder, examples, params, group_size
            )
            if not scored.completions:
                raise DataError(
                    f"all {len(examples)} prompts of a generation pass are longer than "
                    f"rollout.max_prompt_tokens={rollout.max_prompt_tokens}; raise it"
                )
            timing["perf/generate_seconds"] += scored.generate_seconds
            timing["perf/score_seconds"] += scored.score_seconds
            generation_calls.append([len(c.token_ids) for c in scored.completions])
            tokens += sum(generation_calls[-1])
            errors += sum("error" in r.info for r in scored.results)
            rewards, reward_stats = self.shaped_rewards(scored)
            groups = len(scored.completions) // group_size
            generated_groups += groups
            group_ids = torch.arange(groups).repeat_interleave(group_size)
            if algo.dynamic_sampling:
                metric = torch.tensor([float(r.correct) for r in scored.results])
                keep = nonconstant_group_mask(metric if algo.dynamic_sampling_metric == "acc" else rewards, group_ids)
            else:
                keep = torch.ones(len(group_ids), dtype=torch.bool)
            for g in range(groups):
                rows = slice(g * group_size, (g + 1) * group_size)
                if keep[rows].all() and kept_groups < rollout.rollout_prompts:
                    kept.append((_rows(scored, rows), rewards[rows]))
                    kept_groups += 1
        merged = Scored([], [], [], [])
        for part, _ in kept:
            merged.examples += part.examples
            merged.prompts += part.prompts
            merged.completions += part.completions
            merged.results += part.results
        rewards = torch.cat([r for _, r in kept])
        group_ids = torch.arange(len(kept)).repeat_interleave(group_size)
        batch = build_batch(merged, rewards, group_ids, filter_truncated=algo.overlong == "filter")
        if rollout.fire.enabled and rollout.fire.logprob == "mask":
            batch.policy_loss_mask[:, list(rollout.fire.positions)] = False  # FIRE tokens: off-policy
        lengths = batch.response_mask.sum(1).float()
        stats = {
            "reward/mean": batch.rewards.mean().item(),
            "reward/accuracy": batch.correct.float().mean().item(),
            "reward/error_fraction": errors / max(1, generated_groups * group_size),
            "rollout/response_length": lengths.mean().item(),
            "rollout/response_length_max": lengths.max().item(),
            "rollout/truncated_fraction": batch.truncated.float().mean().item(),
            "rollout/generation_passes": float(passes),
            "rollout/kept_group_fraction": kept_groups / max(1, generated_groups),
            "rollout/tokens_generated": float(tokens),
            **fullness_stats(generation_calls),
            **source_stats(merged.results),
            **reward_stats,
            **timing,
        }
        return batch, stats


MAX_SKIPPED_PROMPTS = 1000  # consecutive over-long prompts before the pool gives up


class PoolCollector:
    """T-PPO's rollout stage (arXiv 2506.15050; spec §5 (b)): one window of the rollout pool per step.

    The step's batch holds every sequence the window advanced, each with its prompt and its whole
    response so far.  Masks (spec §5 (b)3, (e)3):
      - ``policy_loss_mask``: the tokens generated in this window (``algo.policy_tokens=window``),
        so each token is trained on once, by the policy that sampled it; or every generated token
        (``all_generated``);
      - ``value_loss_mask``: every response token of the sequences that finished, none of the running
        ones, whose return is not known yet;
      - ``stale_mask``: tokens from earlier windows, whose behaviour log-probs were stored when they
        were sampled (``rollout_logprobs``) and serve as their old log-probs.
    Finished sequences are scored and shaped like synchronous ones; running ones get reward 0 (their
    advantages come from EGAE's bootstrap).  It reuses the synchronous collector's parts: engine,
    stream, prompt encoder, scorer and reward shaping.
    """

    def __init__(self, synchronous: RolloutCollector, pool: RolloutPool) -> None:
        self.synchronous, self.pool = synchronous, pool

    def _new_group(self, step: int):
        collector = self.synchronous
        group_size = collector.cfg.rollout.samples_per_prompt

        def new_group(index: int) -> list[PoolSequence]:
            for _ in range(MAX_SKIPPED_PROMPTS):
                example = collector.stream.take(1, step)[0]
                prompt = collector.encoder(example)
                if prompt is not None:
                    return [PoolSequence(example, prompt, index) for _ in range(group_size)]
            raise DataError(
                f"{MAX_SKIPPED_PROMPTS} prompts in a row are longer than rollout.max_prompt_tokens="
                f"{collector.cfg.rollout.max_prompt_tokens}; raise it"
            )

        return new_group

    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Refill the pool, advance it one window, score what finished; returns the batch and its metrics."""
        collector, cfg = self.synchronous, self.synchronous.cfg
        refilled = self.pool.refill(self._new_group(step))
        occupied = len(self.pool.active)
        window = self.pool.advance(collector.engine, collector.sampling_params(hash_seed(cfg.run.seed, step, 1)))
        sequences = window.sequences
        finished = [i for i, s in enumerate(sequences) if not s.running]
        completions = [Completion(s.token_ids, s.logprobs, s.finish_reason or "length") for s in sequences]
        scored = Scored(
            [sequences[i].example for i in finished],
            [sequences[i].prompt_ids for i in finished],
            [completions[i] for i in finished],
            [],
        )
        started = time.perf_counter()
        texts = collector.tokenizer.batch_decode([c.token_ids for c in scored.completions], skip_special_tokens=True)
        scored.results = collector.pool.score_examples(scored.examples, texts) if finished else []
        score_seconds = time.perf_counter() - started
        rewards = torch.zeros(len(sequences))
        results = [RewardResult(0.0, False) for _ in sequences]
        reward_stats: dict[str, float] = {}
        if finished:
            rewards[finished], reward_stats = collector.shaped_rewards(scored)
            for i, result in zip(finished, scored.results, strict=True):
                results[i] = result
        _, group_ids = torch.unique(torch.tensor([s.group for s in sequences]), return_inverse=True)
        every = Scored([s.example for s in sequences], [s.prompt_ids for s in sequences], completions, results)
        batch = build_batch(every, rewards, group_ids, filter_truncated=False)  # running rows are no truncations
        running = torch.tensor([s.running for s in sequences])
        batch.running = running
        batch.truncated = torch.tensor([s.finish_reason == "length" for s in sequences])
        width = batch.response_mask.shape[1]
        batch.stale_mask = pad_rows([[1] * s.window_start for s in sequences], width, False, torch.bool)
        if cfg.algo.policy_tokens == "window":
            batch.policy_loss_mask &= ~batch.stale_mask
        if cfg.algo.overlong == "filter":
            batch.policy_loss_mask &= ~batch.truncated[:, None]
        batch.value_loss_mask &= ~running[:, None]
        done = ~running
        lengths = batch.response_mask.sum(1).float()[done]
        nan = float("nan")
        stats = {
            "reward/mean": batch.rewards[done].mean().item() if finished else nan,
            "reward/accuracy": batch.correct[done].float().mean().item() if finished else nan,
            "reward/error_fraction": sum("error" in r.info for r in scored.results) / max(1, len(finished)),
            "rollout/response_length": lengths.mean().item() if finished else nan,
            "rollout/response_length_max": lengths.max().item() if finished else nan,
            "rollout/truncated_fraction": batch.truncated[done].float().mean().item() if finished else nan,
            "rollout/tokens_generated": float(sum(window.new_tokens)),
            "rollout/finished_sequences": float(len(finished)),
            "rollout/running_sequences": float(len(sequences) - len(finished)),
            "rollout/pool_fill": occupied / self.pool.slots,
            "rollout/refilled_sequences": float(refilled),
            "rollout/windows_per_response": (
                sum(sequences[i].windows for i in finished) / len(finished) if finished else nan
            ),
            **fullness_stats([window.new_tokens]),
            **source_stats(scored.results),
            **reward_stats,
            "perf/generate_seconds": window.generate_seconds,
            "perf/score_seconds": score_seconds,
        }
        return batch, stats


def fullness_stats(calls: Sequence[Sequence[int]]) -> dict[str, float]:
    """How full the generation batch stayed over some engine calls (tokens per completion, per call):
    ``rollout/slot_utilisation`` (tokens ÷ slot-steps) and ``rollout/underfull_step_fraction``
    (decode steps with an idle slot ÷ all decode steps), weighted by each call's decode steps."""
    steps = [max(c, default=0) for c in calls]
    total = sum(steps)
    if not total:
        return {"rollout/slot_utilisation": 1.0, "rollout/underfull_step_fraction": 0.0}
    shares = [slot_utilisation(list(c)) for c in calls]
    return {
        "rollout/slot_utilisation": sum(s * u for s, (u, _) in zip(steps, shares, strict=True)) / total,
        "rollout/underfull_step_fraction": sum(s * f for s, (_, f) in zip(steps, shares, strict=True)) / total,
    }


def source_stats(results: Sequence[RewardResult]) -> dict[str, float]:
    """Per reward source (results routed by the reward router): mean raw score and share of the batch."""
    by_source: dict[str, list[float]] = {}
    for result in results:
        if "source" in result.info:
            by_source.setdefault(result.info["source"], []).append(result.score)
    stats = {}
    for source, scores in by_source.items():
        stats[f"reward/{source}/mean"] = sum(scores) / len(scores)
        stats[f"reward/{source}/fraction"] = len(scores) / len(results)
    return stats | function_stats(results)


def function_stats(results: Sequence[RewardResult]) -> dict[str, float]:
    """Per term of ``reward.functions``: its mean value (samples it returned None for left out; an error
    counts as 0) and the share of samples it failed on (raised, timed out or died)."""
    values: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for result in results:
        for name, value in result.info.get("terms", {}).items():
            values.setdefault(name, [])
            if value is not None:
                values[name].append(value)
        for name in result.info.get("term_errors", ()):
            errors[name] = errors.get(name, 0) + 1
    stats = {}
    for name, scored in values.items():
        stats[f"reward/fn/{name}/mean"] = sum(scored) / len(scored) if scored else float("nan")
        stats[f"reward/fn/{name}/error_fraction"] = errors.get(name, 0) / len(results)
    return stats


def fire_params(cfg: Config) -> FireParams | None:
    """The FIRE sampling parameters of a config, or None when FIRE is off."""
    fire = cfg.rollout.fire
    return FireParams(fire.temperature, fire.top_k, fire.positions) if fire.enabled else None


def _rows(scored: Scored, rows: slice) -> Scored:
    return Scored(scored.examples[rows], scored.prompts[rows], scored.completions[rows], scored.results[rows])


def hash_seed(*parts: int) -> int:
    """A 31-bit seed derived from integers (run seed, step, pass): reproducible across processes."""
    value = 0x9E3779B9
    for part in parts:
        value = (value * 1_000_003 + part + 0x7F4A7C15) % (2**61 - 1)
    return value % (2**31 - 1)
