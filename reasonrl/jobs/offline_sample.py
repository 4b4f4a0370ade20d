"""``reasonrl data sample``: the offline dataset of DQO and DPO (``data.offline_path``).

The behaviour policy samples ``samples_per_prompt`` responses to each prompt; each is scored and written
with its behaviour log-probs, one JSON line per response (the format: ``reasonrl.data.offline_dataset``).
Resumable: a killed run started again keeps the prompts it finished and samples the rest.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from reasonrl.config import ConfigError, load_config
from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.loaders import DataError, append_record, read_records
from reasonrl.data.offline_dataset import preference_pairs, read_samples
from reasonrl.data.source import ARITHMETIC
from reasonrl.jobs.prompt_sampling import InitialPolicy, prompt_rows, stable_seed
from reasonrl.reward.router import build_router
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.scored import sample_and_score
from reasonrl.timing import Progress

PROMPTS_PER_CALL = 16  # prompts sampled (× samples_per_prompt) per engine call


@dataclass(frozen=True)
class OfflineSampleRun:
    """What ``reasonrl data sample`` runs: the offline dataset of DQO and DPO (``data.offline_path``)."""

    model: str = "smollm2-135m"
    """The behaviour policy that samples the responses (a spec as model.name_or_path)."""

    dataset: str = "arithmetic"
    """The prompts: a built-in set or a jsonl with question/answer fields."""

    split: str = "train"
    """The dataset's split (auto: train where there is one, else its only split)."""

    limit: int | None = None
    """Sample the first N prompts only; None = every prompt."""

    samples_per_prompt: int = 4
    """n: responses sampled per prompt (DPO pairs come from prompts with both a correct and a wrong one)."""

    max_new_tokens: int = 64
    """Cap on a response's tokens."""

    temperature: float = 1.0
    """Sampling temperature; the behaviour log-probs are of the distribution sampled from."""

    out: str = "runs/offline-samples.jsonl"
    """The samples, one JSON line per response; a killed run started again continues it."""

    seed: int = 0
    """Seed of the sampling."""

    overrides: tuple[str, ...] = ()
    """`reasonrl train`-style KEY=VALUE settings for the engine and the scorer (rollout.engine,
    data.prompt_template, reward.*, ...)."""

    def check(self) -> None:
        """Refuse settings that cannot sample anything (ConfigError naming each problem)."""
        checks = [
            (self.samples_per_prompt >= 1, f"--samples-per-prompt must be >= 1, got {self.samples_per_prompt}"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0 (behaviour log-probs of a greedy policy are 0), "
                                   f"got {self.temperature}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


def sampling_settings(settings: OfflineSampleRun) -> dict:
    """What a file's samples were drawn with (every line carries it; a resumed run must match it)."""
    names = ("model", "dataset", "split", "samples_per_prompt", "max_new_tokens", "temperature", "seed", "overrides")
    return {name: list(v) if isinstance(v := getattr(settings, name), tuple) else v for name in names}


def sampled_prompts(cfg, settings: OfflineSampleRun) -> list:
    """The prompts to sample, each once: the first ``limit`` rows of the dataset's split, or the first
    ``limit`` distinct problems of the arithmetic task's training stream (endless: ``limit`` is required)."""
    if settings.dataset != ARITHMETIC:
        rows = prompt_rows(cfg, settings.dataset, settings.split, settings.limit)
        return list({row.id: row for row in reversed(rows)}.values())[::-1]  # a repeated row once, first place
    if settings.limit is None:
        raise DataError("the arithmetic task is endless: give --limit N (its first N distinct training problems)")
    task = ArithmeticTask(cfg.data.arithmetic_digits, cfg.data.arithmetic_operations, settings.seed)
    problems: dict[str, object] = {}
    for index in range(100 * settings.limit):  # the task draws with replacement: skip repeats
        example = task.train_example(index)
        problems.setdefault(example.id, example)
        if len(problems) == settings.limit:
            break
    return list(problems.values())


def run_sampling(settings: OfflineSampleRun, progress: bool | None = False) -> dict:
    """Sample ``samples_per_prompt`` responses to each prompt and score them into ``settings.out``;
    a killed run started again keeps the prompts it finished and samples the rest.  Returns a summary.
    ``progress``: show the sampling on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    settings.check()
    started = time.perf_counter()
    out, sampled_with, n = Path(settings.out), sampling_settings(settings), settings.samples_per_prompt
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = read_records(out)
    if existing and existing[0].get("sampling") != sampled_with:
        before = existing[0].get("sampling") or {}
        changed = ", ".join(sorted(k for k in sampled_with if before.get(k) != sampled_with[k]))
        raise DataError(
            f"{out} was sampled with other settings ({changed}); continue it with the same ones, or give another --out"
        )
    counts: dict[str, int] = defaultdict(int)
    for row in existing:
        counts[row["example_id"]] += 1
    cfg = load_config(None, [f"model.name_or_path={settings.model}", *settings.overrides])
    examples = sampled_prompts(cfg, settings)
    policy = InitialPolicy.load(cfg)
    scorer = build_router(policy.cfg.reward, policy.cfg.model.name_or_path, policy.dtype)
    try:
        with Progress("data sample", progress) as shown:
            shown.stage("sampling", len(examples), "prompts")
            # fixed chunks with fixed seeds: a resumed run samples what an uninterrupted one would have
            for start in range(0, len(examples), PROMPTS_PER_CALL):
                chunk = examples[start : start + PROMPTS_PER_CALL]
                if all(counts[e.id] >= n for e in chunk):
                    shown.advance(len(chunk))
                    continue
                seed = stable_seed(settings.seed, start)
                params = SamplingParams(settings.max_new_tokens, settings.temperature, seed=seed)
                scored = sample_and_score(policy.engine, policy.tokenizer, scorer, policy.encoder, chunk, params, n)
                rows = zip(scored.examples, scored.prompts, scored.completions, scored.results, strict=True)
                for index, (example, prompt, completion, result) in enumerate(rows):
                    j = index % n
                    if j < counts[example.id]:  # written before a kill
                        continue
                    ids = list(completion.token_ids)
                    append_record(out, {
                        "id": f"{example.id}/{j}", "example_id": example.id, "prompt_token_ids": list(prompt),
                        "response_token_ids": ids, "behaviour_logprobs": list(completion.logprobs),
                        "behaviour_logprob_sum": sum(completion.logprobs), "reward": float(result.score),
                        "correct": bool(result.correct), "truncated": completion.finish_reason == "length",
                        "response": policy.tokenizer.decode(ids, skip_special_tokens=True), "sampling": sampled_with,
                    })  # fmt: skip
                shown.advance(len(chunk), tokens=sum(len(c.token_ids) for c in scored.completions))
    finally:
        scorer.close()
    return summarise(out, time.perf_counter() - started)


def summarise(out: Path, wall_seconds: float) -> dict:
    """What an offline dataset holds: responses, prompts, accuracy and the DPO pairs it yields."""
    samples = read_samples(out)
    prompts = {s.example_id for s in samples}
    return {
        "out": str(out),
        "prompts": len(prompts),
        "responses": len(samples),
        "accuracy": sum(s.correct for s in samples) / len(samples),
        "dpo_pairs": len(preference_pairs(samples)),
        "mean_response_tokens": sum(len(s.response_token_ids) for s in samples) / len(samples),
        "wall_seconds": wall_seconds,
    }
