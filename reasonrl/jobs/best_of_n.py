"""``reasonrl data bon``: best-of-N references (Data-Scaling RLHF, arXiv 2503.22230 §3: GenRM vs best-of-N).

For every prompt, ``n`` responses are sampled from the initial policy and the one a Bradley-Terry model
scores highest becomes the prompt's reference, in a dataset of ``open`` prompts that a judge scores
against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reasonrl.config import load_config
from reasonrl.data.examples import Example
from reasonrl.jobs.prompt_sampling import SCORING_CHUNK, InitialPolicy, prompt_rows, write_jsonl
from reasonrl.models.value import is_sequence_classifier, value_model_dir
from reasonrl.reward.bt import RewardModel
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.engine_protocol import share_params
from reasonrl.timing import Progress


@dataclass(frozen=True, kw_only=True)
class BestOfNRun:
    """What ``reasonrl data bon`` runs."""

    prompts: str
    """Prompts: a dataset name or jsonl."""

    reward_model: str
    """A Bradley-Terry model: the --out directory of `reasonrl rm train`."""

    out: str
    """The jsonl to write."""

    n: int = 4
    """Responses sampled per prompt; the Bradley-Terry model's favourite is kept."""

    max_new_tokens: int = 128
    """Cap on a sampled response's tokens."""

    overrides: tuple[str, ...] = ()
    """Config overrides, for example model.name_or_path."""


def best_of_n_references(settings: BestOfNRun, progress: bool | None = False) -> dict:
    """For every prompt, sample ``n`` responses from the initial policy and keep the one the Bradley-Terry
    model scores highest as its reference: rows with task_type ``open`` (GenRM vs best-of-N, Data-Scaling RLHF §3);
    a math prompt's true answer goes to the row's ``verifier_answer`` (``reward/verifier_accuracy`` measures the
    judge against it).  The prompts go SCORING_CHUNK at a time, each keeping its sampling stream in the whole
    call (``share_params``), so the fast and vLLM engines sample what one call would.  ``progress``: show the
    sampling on stderr (``reasonrl.timing.Progress``'s ``show``)."""
    cfg, n, reward_model = load_config(None, list(settings.overrides)), settings.n, settings.reward_model
    if not is_sequence_classifier(reward_model):  # a bad path fails before any sampling
        reward_model = str(value_model_dir(reward_model))
    examples = prompt_rows(cfg, settings.prompts)
    policy = InitialPolicy.load(cfg, template="plain")
    kept = [e for e in examples if policy.encoder(e) is not None]
    params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=1.0, seed=policy.cfg.run.seed)
    rm = RewardModel.load(reward_model, compute_dtype=policy.dtype)
    texts: list[str] = []
    scores: list[float] = []
    with Progress("data bon", progress) as shown:
        shown.stage("sampling and scoring", len(kept), "prompts")
        for start in range(0, len(kept), SCORING_CHUNK):
            chunk = [e for e in kept[start : start + SCORING_CHUNK] for _ in range(n)]
            chunk_params = share_params(params, len(texts), len(texts) + len(chunk))
            completions = policy.engine.generate([policy.encoder(e) for e in chunk], chunk_params)
            replies = policy.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
            scores += rm.score([[{"role": "user", "content": e.question}] for e in chunk], replies)
            texts += replies
            shown.advance(len(chunk) // n, tokens=sum(len(c.token_ids) for c in completions))
    rows = []
    for i, example in enumerate(kept):
        best = max(range(i * n, (i + 1) * n), key=lambda j: scores[j])
        # a verifiable prompt keeps its true answer beside the reference, to measure reward hacking against
        truth = example.answer if example.task_type == "math" else example.fields.get("verifier_answer")
        fields = {"verifier_answer": truth} if truth is not None else {}
        rows.append(Example(example.id, example.question, texts[best].strip(), "open", fields=fields))
    out = write_jsonl(rows, Path(settings.out))
    return {"prompts": len(examples), "written": len(rows), "n": n, "out": str(out)}
