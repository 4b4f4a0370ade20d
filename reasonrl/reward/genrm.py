"""Generative reward model: an LLM judge that scores a response against a reference (Data-Scaling RLHF §3).

"GenRM with ground truth" compares a response with the reference solution of a reasoning task;
"GenRM vs best-of-N" compares it with the initial policy's best-of-N response picked by the
Bradley-Terry model.  Both are the pairwise judge of ``pairwise.py`` (same template, so a judge
trained with `reasonrl rm train --kind pairwise` serves here) with the reference as the anchor,
position-debiased, so the score is in [0, 1] with 0.5 = parity with the reference (the
Data-Scaling paper's convention).  ``parse_verdict`` reads a *generated* verdict, for judges that
answer in text (an API model, or sampling instead of reading logits).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from reasonrl.reward.pairwise import PairwiseJudge

_VERDICT = re.compile(
    r"(?:\[\[\s*([AB]|tie)\s*\]\]|verdict\s*[:=]\s*([AB]|tie)\b|^\s*([AB])\s*[.)!]?\s*$)", re.I | re.M
)


def parse_verdict(text: str) -> float | None:
    """Score of answer A from a generated verdict: 1.0 (A), 0.0 (B), 0.5 (tie); None when there is none.

    Accepts ``[[A]]``, ``Verdict: B``, ``verdict = tie`` anywhere, or a line holding just the letter; the
    last verdict in the text wins (judges often restate the question's options first).
    """
    matches = _VERDICT.findall(text)
    if not matches:
        return None
    verdict = next(group for group in matches[-1] if group).lower()
    return {"a": 1.0, "b": 0.0, "tie": 0.5}[verdict]


class GenRM:
    """score(questions, responses, references) -> [0, 1] per response; 0.5 = as good as the reference."""

    def __init__(self, judge: PairwiseJudge) -> None:
        self.judge = judge

    @classmethod
    def from_model(cls, spec: str, compute_dtype: torch.dtype = torch.float32, device: str = "cpu") -> GenRM:
        """A judge from any causal LM spec (built-in name, local path or hub id), on ``device``."""
        from reasonrl.models.load import load_model, load_tokenizer

        model = load_model(spec, torch.float32, device=device)
        return cls(PairwiseJudge(model, load_tokenizer(spec), compute_dtype=compute_dtype))

    def score(self, questions: Sequence[str], responses: Sequence[str], references: Sequence[str]) -> list[float]:
        """Position-debiased P(response ≻ reference)."""
        return self.judge.debiased_reward(questions, responses, references).tolist()
