"""The embedded default task: seeded arithmetic problems with disjoint train and eval splits.

Problems are ``a op b`` with ``digits``-digit operands.  A problem belongs to the eval split when a
stable hash of its canonical form (operands sorted for commutative operators) falls in the eval
bucket (1 in 5), so no eval problem, nor its commuted twin, is ever trained on.  The train stream is
an infinite, seeded, random-access sequence: ``train_example(i)`` is the same for a given seed.
Difficulty ``digits`` = 2 with ``+`` (two-digit sums) is where SmolLM2-135M-Instruct scores
between 10% and 60% greedy (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from reasonrl.data.examples import Example

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
COMMUTATIVE = {"+", "*"}
EVAL_BUCKETS = 5  # one bucket in five is held out
EVAL_SEED = 1234  # the eval set does not depend on the run seed, so runs compare


@dataclass(frozen=True)
class ArithmeticTask:
    """Problems ``a op b`` with operands of ``digits`` digits and operators drawn from ``operations``."""

    digits: int = 2
    operations: str = "+"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"arithmetic digits must be >= 1, got {self.digits}")
        unknown = set(self.operations) - set(OPERATORS)
        if not self.operations or unknown:
            raise ValueError(f"arithmetic operations must be drawn from '+-*', got {self.operations!r}")

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        low = 1 if self.digits == 1 else 10 ** (self.digits - 1)
        high = 10**self.digits - 1
        return rng.randint(low, high), rng.choice(self.operations), rng.randint(low, high)

    @staticmethod
    def _canonical(a: int, op: str, b: int) -> str:
        """One name for a problem and its commuted twin."""
        return f"{min(a, b)}{op}{max(a, b)}" if op in COMMUTATIVE else f"{a}{op}{b}"

    @classmethod
    def is_eval_problem(cls, a: int, op: str, b: int) -> bool:
        """Whether ``a op b`` (or its commuted twin) belongs to the held-out split."""
        return int(hashlib.sha256(cls._canonical(a, op, b).encode()).hexdigest(), 16) % EVAL_BUCKETS == 0

    @staticmethod
    def _example(a: int, op: str, b: int) -> Example:
        question = f"{a} {op} {b}"
        return Example(question, f"What is {question}?", str(OPERATORS[op](a, b)), data_source="arithmetic")

    def train_example(self, index: int) -> Example:
        """The ``index``-th training problem of this seed (never an eval problem)."""
        rng = random.Random(f"arithmetic-train:{self.seed}:{index}")
        while True:
            a, op, b = self._draw(rng)
            if not self.is_eval_problem(a, op, b):
                return self._example(a, op, b)

    def eval_examples(self, count: int) -> list[Example]:
        """``count`` distinct held-out problems (no two commuted twins), the same for every run seed."""
        rng = random.Random(f"arithmetic-eval:{EVAL_SEED}")
        seen: dict[str, Example] = {}
        attempts = 0
        while len(seen) < count:
            attempts += 1
            if attempts > 1000 * max(count, 1):
                raise ValueError(f"the arithmetic eval split holds fewer than {count} distinct problems")
            a, op, b = self._draw(rng)
            if self.is_eval_problem(a, op, b):
                seen.setdefault(self._canonical(a, op, b), self._example(a, op, b))
        return list(seen.values())
