"""Where a run's prompts come from: a resumable, seeded training stream and a fixed eval set."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.examples import Example
from reasonrl.data.loaders import Fields, has_split, in_holdout, load_examples

ARITHMETIC = "arithmetic"


@dataclass(frozen=True)
class DataSpec:
    """The data settings a source needs (mirrors the ``data`` config group)."""

    dataset: str = ARITHMETIC
    eval_dataset: str | None = None
    arithmetic_digits: int = 2
    arithmetic_operations: str = "+"
    fields: Fields = field(default_factory=Fields)


class TrainingStream:
    """An endless, seeded sequence of training examples; its position is its whole state.

    Finite datasets are reshuffled every epoch with a seed derived from (seed, epoch), so
    ``take`` after ``load_state_dict`` continues exactly where a checkpoint left off.
    """

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.seed = seed
        self.consumed = 0
        self._task: ArithmeticTask | None = None
        self._rows: list[Example] = []
        if spec.dataset == ARITHMETIC:
            self._task = ArithmeticTask(spec.arithmetic_digits, spec.arithmetic_operations, seed)
        else:
            self._rows = training_examples(spec)
        self._order: list[int] = []
        self._order_epoch = -1

    def _row(self, position: int) -> Example:
        if self._task is not None:
            return self._task.train_example(position)
        epoch, index = divmod(position, len(self._rows))
        if epoch != self._order_epoch:
            self._order = list(range(len(self._rows)))
            random.Random(f"epoch:{self.seed}:{epoch}").shuffle(self._order)
            self._order_epoch = epoch
        return self._rows[self._order[index]]

    def take(self, count: int) -> list[Example]:
        """The next ``count`` examples."""
        examples = [self._row(self.consumed + i) for i in range(count)]
        self.consumed += count
        return examples

    def state_dict(self) -> dict[str, int]:
        """The stream position (for checkpoints)."""
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position."""
        self.consumed = int(state["consumed"])


def _single_split(source: str, fields: Fields) -> list[Example]:
    return load_examples(source, "test" if has_split(source, "test") else "train", fields)


def training_examples(spec: DataSpec) -> list[Example]:
    """Rows to train on: the train split, or a single-split source minus its hold-out (unless a
    separate eval source is given)."""
    if has_split(spec.dataset, "train"):
        return load_examples(spec.dataset, "train", spec.fields)
    rows = _single_split(spec.dataset, spec.fields)
    return rows if spec.eval_dataset else [row for row in rows if not in_holdout(row)]


def eval_examples(spec: DataSpec, count: int) -> list[Example]:
    """The first ``count`` held-out examples of a run, disjoint from its training rows."""
    source = spec.eval_dataset or spec.dataset
    if spec.eval_dataset is None and source != ARITHMETIC and not has_split(source, "train"):
        return [row for row in _single_split(source, spec.fields) if in_holdout(row)][:count]
    return benchmark_examples(source, count, spec)


def benchmark_examples(source: str, count: int | None, spec: DataSpec = DataSpec()) -> list[Example]:
    """Examples to evaluate on: the arithmetic eval split, a built-in test split, or every row of a file."""
    if source == ARITHMETIC:
        return ArithmeticTask(spec.arithmetic_digits, spec.arithmetic_operations).eval_examples(count or 200)
    rows = _single_split(source, spec.fields)
    return rows if count is None else rows[:count]
