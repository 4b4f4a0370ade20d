"""Evaluation: greedy pass@1, and avg@k / maj@k / pass@k over n ≥ k sampled answers per problem,
overall and per data source."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from reasonrl.config import Config, ConfigError, load_config
from reasonrl.config.rollout_schema import FireConfig
from reasonrl.config.routes import VERIFIER_SOURCES, resolve_routes
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError, Fields
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import benchmark_examples, eval_examples
from reasonrl.jobs.eval_metrics import pag_metrics, per_source_metrics, sampled_metrics
from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device, vision_processor
from reasonrl.reward.custom import RewardFunctionError, RewardTerm, reward_terms
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.engine_protocol import share_params
from reasonrl.rollout.multiturn.conversations import injected_ids, run_conversations
from reasonrl.rollout.multiturn.episodes import (
    ROLE_INJECTED,
    ROLE_POLICY,
    ROLE_VERIFIER,
    Conversation,
    Environment,
    Injection,
    Segment,
    Step,
)
from reasonrl.rollout.multiturn.pag_rules import PAG_VERIFY_PROMPT, PAGRule, parse_verdict, probability_correct
from reasonrl.rollout.sampling import fire_params
from reasonrl.rollout.scored import Scored, sample_and_score
from reasonrl.timing import Progress
from reasonrl.training.record.rundir import CONFIG_FILE, RECORD_FILE
from reasonrl.training.run_inputs import build_scorer, data_spec

log = logging.getLogger(__name__)
VLLM_BATCH_SEQUENCES = 256  # the vLLM engine's default max_batch_sequences (it keeps no attribute for it)

STANDALONE_DATASET = "arithmetic"
"""What ``reasonrl eval`` evaluates a model that is not a run directory on, unless told."""

STANDALONE_MAX_NEW_TOKENS = 256
"""``reasonrl eval``'s cap on an answer's tokens for a model that is not a run directory, unless told."""


@dataclass(frozen=True)
class EvalSettings:
    """What ``reasonrl eval`` runs; the first sentence of each field's docstring is its option's help."""

    model: str = "smollm2-135m"
    """Model spec (as model.name_or_path) or a run directory.  A spec is a built-in name, a local directory,
    a .gguf file or a hub id; a run directory means its final model, and the settings left unset (None) are
    then the run's own: what its evaluation used, from its config.yaml."""

    dataset: str | None = None
    """A built-in dataset (listed below), a .jsonl/.parquet file with question/answer fields, or a hub id
    owner/name (default: a run's held-out problems, else arithmetic).  A run's held-out problems are
    data.eval_dataset, else the hold-out of data.dataset: the first data.eval_prompts, as its evaluation."""

    question_field: str | None = None
    """Field of a file's rows holding the question (default: a run's data.question_field, else question).
    A `datasets` name's rows too."""

    answer_field: str | None = None
    """Field of a file's rows holding the final answer (default: a run's data.answer_field, else answer).
    Dotted for nested fields."""

    k: int = 1
    """Samples per problem for avg@k, maj@k, pass@k (greedy_pass@1 is greedy)."""

    samples: int | None = field(default=None, metadata={"option": "n"})
    """Samples drawn per problem (>= k; default k): pass@k is estimated from n.  It is the unbiased
    estimate from n."""

    system_prompt: str | None = None
    """A system message before every prompt (default: a run's data.system_prompt, else none).  As
    data.system_prompt; "" = none with a run directory too."""

    temperature: float = 1.0
    """Sampling temperature of the k samples (greedy_pass@1 is always greedy)."""

    top_p: float = 1.0
    """Nucleus threshold of the k samples; 1.0 = off."""

    max_new_tokens: int | None = None
    """Cap on an answer's tokens (default: a run's rollout.max_response_tokens, else 256)."""

    limit: int | None = None
    """Evaluate the first N problems only; None = all of them (a run's held-out problems: data.eval_prompts)."""

    prompt_template: Literal["answer_line", "boxed", "plain"] | None = field(
        default=None, metadata={"option": "template"}
    )
    """How a question is asked (default: a run's data.prompt_template, else answer_line).  As
    data.prompt_template."""

    seed: int = 0
    """Seed of the k samples."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model generates: auto = a CUDA GPU when one is visible, else the CPU.  On a GPU, vLLM where
    installed, else transformers' generate (as model.device)."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights' dtype for generation (as model.dtype)."""

    fire: bool = False
    """FIRE: sample the first token flaming-hot.  In the k sampled answers only (greedy_pass@1 stays greedy),
    as ``rollout.fire`` with the temperature and top-k below."""

    fire_temperature: float = FireConfig.temperature
    """FIRE: temperature of the first token (as rollout.fire.temperature)."""

    fire_top_k: int = FireConfig.top_k
    """FIRE: top-k of the first token (as rollout.fire.top_k)."""

    protocol: Literal["single", "pag"] = "single"
    """pag: also answer, self-verify and revise (PAG), reporting acc@t1, acc@final, verifier_accuracy.
    single: one answer per prompt; pag: also PAG's protocol (arXiv 2506.10406): the greedy answer, the
    model's verify turn, and a revision after any verdict but "correct", up to max_attempts (acc@t1,
    acc@final, verifier_accuracy, delta_i_to_c, delta_c_to_i, revision_rate)."""

    max_attempts: int = 2
    """PAG: answers at most (the paper evaluates with 2)."""

    self_verify_bon: bool = False
    """PAG self-verify best-of-k: keep the sampled answer the model's own verdict rates most likely correct.
    The model verifies each of the k sampled answers (a greedy verify turn) and the answer whose verdict
    gives "correct" the highest probability is kept: ``self_verify_bon@k``, next to ``maj@k``."""

    records: str | None = None
    """Also write every greedy answer (id, response, tokens, score, verdict) to this .jsonl.  Its problem
    id, data source, response, response tokens, score and verdict, for breakdowns the summary does not make
    (accuracy by response length, say)."""

    overrides: tuple[str, ...] = ()
    """reward.* settings as for train, as "reward.functions=['my_rewards.py:score']" (default: a run's).  They
    score the answers (reward.functions, reward.weights, reward.routes, reward.workers,
    reward.timeout_seconds), over a run directory's own."""

    def fire_config(self) -> FireConfig:
        """FIRE's sampling of the k answers, as the run config holds it."""
        return FireConfig(enabled=self.fire, temperature=self.fire_temperature, top_k=self.fire_top_k)

    def completed(self, cfg: Config, of_run: bool) -> EvalSettings:
        """These settings with each unset one filled in from ``cfg``'s data and rollout settings: a run
        directory's config (``of_run``: what its evaluation used), else the defaults of a standalone eval."""
        data = cfg.data
        inherited = {
            "max_new_tokens": cfg.rollout.max_response_tokens if of_run else STANDALONE_MAX_NEW_TOKENS,
            "prompt_template": data.prompt_template,
            "system_prompt": data.system_prompt,
            "question_field": data.question_field,
            "answer_field": data.answer_field,
        }
        if not of_run:  # a run's unset dataset stays None: its held-out problems
            inherited["dataset"] = STANDALONE_DATASET
        return replace(self, **{name: value for name, value in inherited.items() if getattr(self, name) is None})

    def check(self) -> None:
        """Refuse settings that cannot be evaluated, before anything loads (ConfigError naming each problem)."""
        not_reward = [item for item in self.overrides if not item.strip().startswith("reward.")]
        checks = [
            (not not_reward, f"eval takes reward.* settings only as KEY=VALUE (got {', '.join(not_reward)}); "
                             "give the others as options (--dataset, --question-field, --template, ...)"),
            (self.k >= 1, f"--k must be >= 1 (samples per problem), got {self.k}"),
            (self.samples is None or self.samples >= self.k,
             f"--n {self.samples} samples cannot estimate pass@{self.k}; give --n >= --k"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.max_new_tokens is None or self.max_new_tokens >= 1,
             f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0 (of the k samples), got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (self.max_attempts >= 1, f"--max-attempts must be >= 1, got {self.max_attempts}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


class _VerifyOnce(Environment):
    """An environment that ends every conversation after the turn it generates."""

    def step(self, episode: Conversation) -> Step:
        return Step()


VERIFY_ONCE = _VerifyOnce()


def pag_protocol(engine, tokenizer, pool, encoder, examples, params, settings: EvalSettings) -> dict[str, float]:
    """Greedy PAG conversations (answer, verify, revise after any verdict but "correct"), scored turn by turn."""
    conversations = [Conversation(encoder(e), encoder.messages(e), stream=i) for i, e in enumerate(examples)]
    rule = PAGRule(settings.max_attempts, revise_unparsed=True)
    turns = 2 * settings.max_attempts - 1  # each capped at max_new_tokens: no cap on the whole conversation
    run_conversations(engine, tokenizer, conversations, rule, params, max_turns=turns)
    attempts = [(i, a.text) for i, c in enumerate(conversations) for a in c.turns(ROLE_POLICY)]
    results = iter(pool.score_examples([examples[i] for i, _ in attempts], [text for _, text in attempts]))
    correct = [[next(results).correct for _ in c.turns(ROLE_POLICY)] for c in conversations]
    verdicts = [[parse_verdict(t.text) for t in c.turns(ROLE_VERIFIER)] for c in conversations]
    return pag_metrics(correct, verdicts)


def self_verify_best_of_n(engine, tokenizer, encoder, sampled, samples: int, params) -> float:
    """PAG's self-verify BoN: every sampled answer gets a greedy verify turn; per problem, the answer whose
    verdict gives "correct" the highest probability (``probability_correct``; ties: the first) is kept.
    Returns the kept answers' accuracy."""
    conversations = []
    for i, (example, completion) in enumerate(zip(sampled.examples, sampled.completions, strict=True)):
        c = Conversation(encoder(example), encoder.messages(example), stream=i)
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        c.segments.append(
            Segment(completion.token_ids, completion.logprobs, ROLE_POLICY, text, completion.finish_reason)
        )
        ids, c.messages = injected_ids(tokenizer, c, Injection(PAG_VERIFY_PROMPT, ROLE_VERIFIER))
        c.segments.append(Segment(ids, [0.0] * len(ids), ROLE_INJECTED, PAG_VERIFY_PROMPT))
        c.next_role = ROLE_VERIFIER
        conversations.append(c)
    run_conversations(engine, tokenizer, conversations, VERIFY_ONCE, params, max_turns=1)
    scores = [probability_correct(tokenizer, c.turns()[-1]) for c in conversations]
    kept = []
    for start in range(0, len(conversations), samples):
        best = max(range(start, start + samples), key=lambda i: (scores[i], -i))
        kept.append(sampled.results[best].correct)
    return sum(kept) / max(1, len(kept))


def write_records(scored, tokenizer, path: Path) -> None:
    """One JSON line per answer: problem id, data source, response, response tokens, score, verdict."""
    texts = tokenizer.batch_decode([c.token_ids for c in scored.completions], skip_special_tokens=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for example, completion, result, text in zip(
            scored.examples, scored.completions, scored.results, texts, strict=True
        ):
            record = {"id": example.id, "data_source": example.data_source, "response": text,
                      "response_tokens": len(completion.token_ids), "score": result.score,
                      "correct": bool(result.correct)}  # fmt: skip
            handle.write(json.dumps(record) + "\n")


def scored_in_batches(
    engine, tokenizer, pool, encoder, examples, params, progress: Progress, repeats: int = 1
) -> Scored:
    """``sample_and_score`` one engine batch of problems at a time, telling ``progress`` the problems done,
    the share of answers right so far and the tokens generated.  Each prompt keeps the sampling stream it
    has in one call (``share_params``), so the fast and vLLM engines answer exactly as in one call."""
    size = max(1, (engine.max_batch_sequences or VLLM_BATCH_SEQUENCES) // repeats)
    parts: list[Scored] = []
    answers = right = 0
    for start in range(0, len(examples), size):
        chunk = examples[start : start + size]
        part_params = share_params(params, answers, answers + len(chunk) * repeats)
        parts.append(sample_and_score(engine, tokenizer, pool, encoder, chunk, part_params, repeats))
        answers += len(parts[-1].results)
        right += sum(r.correct for r in parts[-1].results)
        tokens = sum(len(c.token_ids) for c in parts[-1].completions)
        progress.advance(len(chunk), tokens=tokens, status=f"acc {right / max(1, answers):.2f}")
    return Scored.concat(parts)


def eval_config(settings: EvalSettings) -> tuple[Config, Path | None]:
    """The config eval fills its unset settings from and scores with: a run directory's ``config.yaml``
    (returned too), else the defaults; the reward.* overrides on top of either."""
    run_dir = Path(settings.model).expanduser()
    recorded = run_dir / CONFIG_FILE
    if (run_dir / RECORD_FILE).is_file() and recorded.is_file():
        return load_config(recorded, settings.overrides), recorded
    return load_config(None, settings.overrides), None


def recorded_by(recorded: Path, setting: str, instead: str) -> str:
    """Where a run's setting that failed came from, and what to do (its paths are relative to where it ran)."""
    return (
        f" (the {setting} that {recorded} records: files and modules are found from the current directory; "
        f"run eval where the run was started, or give {instead})"
    )


def eval_problems(settings: EvalSettings, cfg: Config, recorded: Path | None) -> tuple[str, list[Example]]:
    """The dataset's name and its problems: every row of ``settings.dataset`` (or the first ``limit``); with
    none set, a run's held-out problems as its own evaluation took them (data.eval_prompts unless ``limit``)."""
    optional = cfg.rollout.multiturn == "env" and settings.dataset is None  # an environment run's own rows
    fields = Fields(settings.question_field, settings.answer_field, named_by="options", answer_optional=optional)
    spec = replace(data_spec(cfg), fields=fields)
    if settings.dataset is not None:
        return settings.dataset, benchmark_examples(settings.dataset, settings.limit, spec)
    assert recorded is not None  # only a run leaves the dataset unset
    try:
        return spec.eval_dataset or spec.dataset, eval_examples(spec, settings.limit or cfg.data.eval_prompts)
    except DataError as exc:
        raise DataError(f"{exc}{recorded_by(recorded, 'data.dataset', '--dataset')}") from None


def eval_reward_terms(cfg: Config, recorded: Path | None, overrides: Sequence[str]) -> list[RewardTerm]:
    """The terms of ``cfg``'s reward.functions, each imported here, before any model loads (a ConfigError
    says which failed, and where a run's record named it)."""
    try:
        return reward_terms(cfg.reward.functions, cfg.reward.weights)
    except RewardFunctionError as exc:
        if recorded is None or any(item.strip().startswith("reward.functions") for item in overrides):
            raise ConfigError(str(exc)) from None
        raise ConfigError(f"{exc}{recorded_by(recorded, 'reward.functions', 'reward.functions=...')}") from None


def check_scorable(dataset: str, examples: list[Example], cfg: Config, terms: list[RewardTerm]) -> None:
    """Refuse prompts that only a judge can score where the built-in scorer scores them (no reward.functions,
    or ``verifier`` among them): eval scores with programs (verifiers, reward functions), never a model."""
    if terms and all(term.function is not None for term in terms):
        return
    routes = resolve_routes(cfg.reward.routes)
    unscorable = sorted({e.task_type for e in examples if routes.get(e.task_type) not in VERIFIER_SOURCES})
    if unscorable:
        raise DataError(
            f"{dataset} holds {', '.join(unscorable)} prompts, which only a judge can score; eval scores tasks a "
            f"program checks ({', '.join(VERIFIER_SOURCES)}): give such a dataset, or reward.functions that "
            "score these"
        )


def check_episode_eval(settings: EvalSettings, cfg: Config) -> None:
    """Refuse, before any model loads, what an environment run's evaluation cannot do (it plays one greedy episode
    per problem), and an environment that cannot be loaded (ConfigError, one line)."""
    from reasonrl.rollout.multiturn.environments import EnvironmentLoadError, environment_class
    from reasonrl.rollout.multiturn.openenv_environments import OPENENV_PREFIX

    unplayable = [
        option
        for option, asked in (("--k/--n", settings.k > 1 or (settings.samples or 1) > 1), ("--protocol pag",
            settings.protocol == "pag"), ("--self-verify-bon", settings.self_verify_bon), ("--fire", settings.fire))
        if asked
    ]  # fmt: skip
    if unplayable:
        raise ConfigError(
            f"{settings.model} is an environment run: its evaluation plays one greedy episode per problem, as the run "
            f"evaluated; {', '.join(unplayable)} need single answers (give --dataset to evaluate single answers)"
        )
    name = cfg.rollout.environment if cfg.rollout.multiturn == "env" else None
    if name and not name.startswith(OPENENV_PREFIX):
        try:
            environment_class(name)
        except EnvironmentLoadError as exc:
            raise ConfigError(str(exc)) from None


def environment_eval(
    settings: EvalSettings, cfg: Config, dataset: str, examples: list[Example], engine, tokenizer, pool, started: float
) -> dict[str, Any]:
    """A run's held-out problems played as its own evaluation plays them (``rollout.multiturn`` env or tool): one
    greedy episode each of the run's environment, with its turns, tools and rewards (``greedy_pass@1``: the
    episodes the environment or the verifier counts as solved, as the run's ``eval/accuracy``)."""
    from reasonrl.config import resolve
    from reasonrl.data.source import TrainingStream
    from reasonrl.training.rollouts.conversation_stage import ConversationCollector
    from reasonrl.training.rollouts.rollout_stage import RolloutCollector, RolloutSettings
    from reasonrl.training.run_inputs import prompt_encoder

    encoder = prompt_encoder(cfg, tokenizer, vision_processor(settings.model))
    synchronous = RolloutCollector(
        RolloutSettings.of(cfg, resolve(cfg)), engine, tokenizer, pool, TrainingStream(data_spec(cfg), 0), encoder
    )
    played = ConversationCollector(synchronous).evaluate(examples, SamplingParams(settings.max_new_tokens, 0.0))
    return {
        "model": settings.model,
        "dataset": dataset,
        "environment": cfg.rollout.environment if cfg.rollout.multiturn == "env" else "python",
        "reward_functions": list(cfg.reward.functions),
        "problems": len(examples),
        "greedy_pass@1": played["eval/accuracy"],
        **{key.removeprefix("eval/"): value for key, value in played.items() if key != "eval/accuracy"},
        "wall_seconds": time.perf_counter() - started,
    }


def scored_passes(
    settings: EvalSettings, engine, tokenizer, pool, encoder: PromptEncoder, examples: list[Example], progress
) -> tuple[Scored, Scored, dict[str, float]]:
    """The evaluation's passes over ``examples``: one greedy answer each, ``samples`` sampled ones each, and
    with --protocol pag / --self-verify-bon their conversations' metrics."""
    greedy_params = SamplingParams(settings.max_new_tokens, temperature=0.0)
    sampled_params = SamplingParams(
        settings.max_new_tokens,
        settings.temperature,
        settings.top_p,
        seed=settings.seed,
        fire=fire_params(settings.fire_config()),
    )
    n, samples = len(examples), settings.samples or settings.k
    with Progress("eval", progress) as shown:
        shown.stage("greedy", n, "problems")
        greedy = scored_in_batches(engine, tokenizer, pool, encoder, examples, greedy_params, shown)
        shown.stage("sampled", n, "problems")
        sampled = scored_in_batches(engine, tokenizer, pool, encoder, examples, sampled_params, shown, samples)
        pag: dict[str, float] = {}
        if settings.protocol == "pag":
            pag = shown.measure(
                "pag",
                n,
                "problems",
                lambda: pag_protocol(engine, tokenizer, pool, encoder, examples, greedy_params, settings),
            )
        if settings.self_verify_bon:
            pag["self_verify_bon@k"] = shown.measure(
                "self-verify",
                n,
                "problems",
                lambda: self_verify_best_of_n(engine, tokenizer, encoder, sampled, samples, greedy_params),
            )
    return greedy, sampled, pag


def run_eval(settings: EvalSettings, progress: bool | None = False) -> dict[str, Any]:
    """Evaluate a model spec on a dataset; returns the metrics (what ``reasonrl eval`` prints).
    A run directory's own settings (dataset, fields, prompt, response cap, reward functions) fill in
    those ``settings`` leaves unset.  ``progress``: show the passes on stderr (``Progress``'s ``show``)."""
    settings.check()
    started = time.perf_counter()
    cfg, recorded = eval_config(settings)
    if recorded is not None:
        log.info("evaluating with the settings of %s where no option gives them", recorded)
    settings = settings.completed(cfg, of_run=recorded is not None)
    dataset, examples = eval_problems(settings, cfg, recorded)
    terms = eval_reward_terms(cfg, recorded, settings.overrides)
    # a run of an environment evaluates as it did: episodes (on its held-out problems; --dataset: single answers)
    episodes = recorded is not None and settings.dataset is None and cfg.rollout.multiturn in ("env", "tool")
    if episodes:
        check_episode_eval(settings, cfg)
    else:
        check_scorable(dataset, examples, cfg, terms)
    device, dtype = resolve_device(settings.device), compute_dtype(settings.dtype)
    tokenizer = load_tokenizer(settings.model)
    model = load_model(settings.model, device=device)
    engine = build_engine("auto", model, tokenizer, dtype=dtype)
    del model
    encoder = PromptEncoder(
        tokenizer, settings.prompt_template, 10**9, settings.system_prompt, processor=vision_processor(settings.model)
    )
    # as training scores: the reward router's verifiers (math answers, code run against its tests in the
    # sandbox), and with reward.functions their weighted sum (judge-scored prompts were refused above)
    pool = build_scorer(cfg, dtype, device, terms=terms)
    if episodes:  # the run's evaluation plays episodes of its environment
        try:
            return environment_eval(settings, cfg, dataset, examples, engine, tokenizer, pool, started)
        finally:
            pool.close()
    try:
        greedy, sampled, pag = scored_passes(settings, engine, tokenizer, pool, encoder, examples, progress)
    finally:
        pool.close()
    if settings.records:
        write_records(greedy, tokenizer, Path(settings.records))
    samples = settings.samples or settings.k
    groups = [sampled.results[i * samples : (i + 1) * samples] for i in range(len(examples))]
    return {
        "model": settings.model,
        "dataset": dataset,
        "reward_functions": list(cfg.reward.functions),
        "problems": len(examples),
        "k": settings.k,
        "temperature": settings.temperature,
        "fire": settings.fire,
        "samples": samples,
        "greedy_pass@1": sum(r.correct for r in greedy.results) / max(1, len(examples)),
        **sampled_metrics(groups, settings.k),
        "per_source": per_source_metrics(examples, greedy.results, groups, settings.k),
        **pag,
        "wall_seconds": time.perf_counter() - started,
    }
