"""Offline datasets: responses sampled beforehand, with their rewards and behaviour log-probs.

``reasonrl data sample`` writes one JSON line per response (``reasonrl.jobs.offline_sample``); ``data.offline_path``
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

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reasonrl.data.loaders import DataError, json_object

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
