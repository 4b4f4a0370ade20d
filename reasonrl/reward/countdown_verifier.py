"""The Countdown verifier: the response's last ``<answer>`` reaches the puzzle's target with its numbers.

The check is the task's own (``data/countdown.Puzzle.solved_by``): the expression is parsed, never run, and
only its value and the numbers it uses count, never what the response says about them.  The ``countdown``
environment rewards an episode's end with the same check; this verifier scores single-turn responses
(the held-out evaluation, or GRPO on the puzzles without the environment).
"""

from __future__ import annotations

from reasonrl.data.countdown import Puzzle, final_answer
from reasonrl.reward.verifier_protocol import RewardResult


class CountdownVerifier:
    """``verifier(response, reference)``: 1 when the response solves the puzzle ``reference`` holds, else 0."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        solved = Puzzle.from_reference(reference).solved_by(response)
        return RewardResult(float(solved), solved, {"extracted": final_answer(response)})
