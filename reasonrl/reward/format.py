"""The format reward: did the response state its final answer explicitly?"""

from __future__ import annotations

from reasonrl.reward.math import extract_answer
from reasonrl.reward.verifier_protocol import RewardResult


class FormatVerifier:
    """Score 1.0 when the final answer is given as ``\\boxed{...}`` or an "Answer: ..." line, else 0.0."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        _, how = extract_answer(response)
        explicit = how in ("boxed", "answer_line")
        return RewardResult(float(explicit), explicit, {"found_by": how})
