"""The verifier protocol: a response and a reference in, a RewardResult out."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from reasonrl.config.ranges import finite_number

if TYPE_CHECKING:
    from reasonrl.data.examples import Example


def reward_number(value: Any) -> float:
    """A reward from user code (a reward function, an environment) as the float the batch holds: a real number
    that is finite in float32.  Raises TypeError for anything else (NaN, an infinity, 1e39: a finite Python
    float that would be inf in the batch and turn every advantage of it NaN), which fails that sample only."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a reward is a finite number, not {value!r}"[:200])
    number = float(value)
    if not finite_number(number):
        raise TypeError(f"a reward is a finite number within float32's range (±3.4e38), not {value!r}"[:200])
    return number


@dataclass(frozen=True)
class RewardResult:
    """What a verifier says about one response."""

    score: float
    """The reward before run-level shaping (e.g. 1.0 correct / 0.0 wrong)."""

    correct: bool
    """Whether the final answer is right (drives accuracy, dynamic sampling and the NLL term)."""

    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics: the extracted answer, why it was judged so, or the error that occurred."""


class Verifier(Protocol):
    """A picklable callable: ``verifier(response_text, reference_answer) -> RewardResult``.

    It runs in a worker process (so it may use signals, as math-verify does) under a time limit.
    """

    def __call__(self, response: str, reference: str) -> RewardResult: ...


@dataclass(frozen=True)
class ScoringContext:
    """What a batch of responses brings besides their texts, for the reward functions that read it (TRL's
    ``completion_ids`` and ``trainer_state``).  Per-response fields hold one entry per response, in order."""

    completion_ids: tuple[tuple[int, ...], ...] | None = None
    """Each response's token ids, as the engine generated them."""
    step: int = 0
    """The rollout step the responses train (0: outside training, e.g. an evaluation)."""
    max_steps: int = 0
    """The run's last rollout step (train.rollout_steps; 0 outside training)."""

    def rows(self, index: Sequence[int]) -> ScoringContext:
        """The context of the responses ``index`` (a share of the batch scored elsewhere)."""
        ids = None if self.completion_ids is None else tuple(self.completion_ids[i] for i in index)
        return ScoringContext(ids, self.step, self.max_steps)


class Scorer(Protocol):
    """What the rollout stage scores with: a verifier pool or the reward router."""

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        """One result per (example, response); ``context`` for the reward functions that read more of the batch."""
        ...

    def close(self) -> None:
        """Release worker processes."""
        ...
