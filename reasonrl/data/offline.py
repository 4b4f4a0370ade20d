"""Offline datasets: responses sampled beforehand, with their rewards and behaviour log-probs.

``reasonrl data sample`` writes one JSON line per response (``run_sampling``); ``data.offline_path``
feeds the file to the offline presets: DQO trains on every response, DPO on the pairs
``preference_pairs`` forms from it.  A line::

    {"id": "gsm8k/12/3", "example_id": "gsm8k/12", "prompt_token_ids": [...], "response_token_ids": [...],
     "behaviour_logprobs": [...], "behaviour_logprob_sum": -41.2, "reward": 1.0, "correct": true,
     "truncated": false, "response": "...", "process_rewards": [[token_index, reward], ...],
     "sampling": {"model": ..., "temperature": 1.0, ...}}

``process_rewards`` is optional: per-step rewards added to the outcome on the given response tokens
(DQO's process supervision; a bandit method like DPO cannot use them).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reasonrl.config.commands import OfflineSampleRun
from reasonrl.data.loaders import DataError, append_record, json_object, read_records
from reasonrl.timing import Progress

PROMPTS_PER_CALL = 16  # prompts sampled (× samples_per_prompt) per engine call
REQUIRED = ("id", "example_id", "prompt_token_ids", "response_token_ids", "behaviour_logprobs", "reward", "correct")


@dataclass(frozen=True)
class OfflineSample:
    """One sampled response of an offline dataset."""

    id: str
    example_id: str
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    """log μ(a_h|s_h) of each response token under the policy that sampled it."""
    reward: float
    """The outcome reward (the scorer's score when sampled)."""
    correct: bool
    truncated: bool = False
    process_rewards: tuple[tuple[int, float], ...] = ()
    """(response token index, reward) pairs added to the outcome's per-token rewards."""


def _sample(location: str, row: dict) -> OfflineSample:
    missing = [name for name in REQUIRED if name not in row]
    if missing:
        raise DataError(f"{location}: missing {', '.join(missing)} (an offline sample needs {', '.join(REQUIRED)})")
    response, logprobs = row["response_token_ids"], row["behaviour_logprobs"]
    if not response:
        raise DataError(f"{location}: empty response_token_ids")
    if not row["prompt_token_ids"]:
        raise DataError(f"{location}: empty prompt_token_ids (the first response token is predicted from the prompt)")
    if len(logprobs) != len(response):
        raise DataError(
            f"{location}: {len(logprobs)} behaviour_logprobs for {len(response)} response tokens (one per token)"
        )
    numbers = [row["reward"], *logprobs, *(value for _, value in row.get("process_rewards", []))]
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in numbers):
        raise DataError(f"{location}: reward, behaviour_logprobs and process_rewards must be finite numbers")
    if any(x > 1e-4 for x in logprobs):
        raise DataError(f"{location}: a behaviour log-prob is positive; they are log-probabilities (<= 0)")
    process = tuple((int(index), float(value)) for index, value in row.get("process_rewards", []))
    if any(not 0 <= index < len(response) for index, _ in process):
        raise DataError(f"{location}: a process reward's token index is outside the response")
    return OfflineSample(
        str(row["id"]),
        str(row["example_id"]),
        tuple(int(t) for t in row["prompt_token_ids"]),
        tuple(int(t) for t in response),
        tuple(float(x) for x in logprobs),
        float(row["reward"]),
        bool(row["correct"]),
        bool(row.get("truncated", False)),
        process,
    )


def read_samples(path: str | Path) -> list[OfflineSample]:
    """Every sample of an offline dataset, in file order; a malformed line is a DataError naming it."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such offline dataset; write one with `reasonrl data sample --out {path}`")
    samples, seen = [], {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json_object(line, f"{path}:{number}")
        sample = _sample(f"{path}:{number}", row)
        if sample.id in seen:
            raise DataError(f"{path}:{number}: id {sample.id!r} is already the id of line {seen[sample.id]}")
        seen[sample.id] = number
        samples.append(sample)
    if not samples:
        raise DataError(f"{path}: no samples")
    return samples


def preference_pairs(samples: Sequence[OfflineSample]) -> list[tuple[int, int]]:
    """DPO's (chosen, rejected) pairs as indices into ``samples``: within each prompt, the i-th correct
    response with the i-th wrong one, in sampling order, so each response is in at most one pair; a prompt
    whose responses are all right or all wrong gives none.  Prompts in file order."""
    right: dict[str, list[int]] = defaultdict(list)
    wrong: dict[str, list[int]] = defaultdict(list)
    for index, sample in enumerate(samples):
        (right if sample.correct else wrong)[sample.example_id].append(index)
    prompts = dict.fromkeys(sample.example_id for sample in samples)
    return [pair for prompt in prompts for pair in zip(right[prompt], wrong[prompt], strict=False)]


# --- `reasonrl data sample` -------------------------------------------------------------------------


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def sampling_settings(settings: OfflineSampleRun) -> dict:
    """What a file's samples were drawn with (every line carries it; a resumed run must match it)."""
    names = ("model", "dataset", "split", "samples_per_prompt", "max_new_tokens", "temperature", "seed", "overrides")
    return {name: list(v) if isinstance(v := getattr(settings, name), tuple) else v for name in names}


def sampled_prompts(cfg, settings: OfflineSampleRun) -> list:
    """The prompts to sample, each once: the first ``limit`` rows of the dataset's split, or the first
    ``limit`` distinct problems of the arithmetic task's training stream (endless: ``limit`` is required)."""
    from reasonrl.data.arithmetic import ArithmeticTask
    from reasonrl.data.select import prompt_rows
    from reasonrl.data.source import ARITHMETIC

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
    from reasonrl.config import load_config
    from reasonrl.data.select import InitialPolicy
    from reasonrl.reward.router import build_router
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.scored import sample_and_score

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
    scorer = build_router(policy.cfg, policy.dtype)
    try:
        with Progress("data sample", progress) as shown:
            shown.stage("sampling", len(examples), "prompts")
            # fixed chunks with fixed seeds: a resumed run samples what an uninterrupted one would have
            for start in range(0, len(examples), PROMPTS_PER_CALL):
                chunk = examples[start : start + PROMPTS_PER_CALL]
                if all(counts[e.id] >= n for e in chunk):
                    shown.advance(len(chunk))
                    continue
                params = SamplingParams(settings.max_new_tokens, settings.temperature, seed=_seed(settings.seed, start))
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
