"""Where a run's prompts come from: a resumable, seeded training stream and a fixed eval set."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from typing import TYPE_CHECKING

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.curriculum import TaskMixSampler, parse_task_mix
from reasonrl.data.examples import Example
from reasonrl.data.loaders import (
    HOLDOUT_BUCKETS,
    DataError,
    Fields,
    check_dataset_name,
    has_split,
    in_holdout,
    load_examples,
)

if TYPE_CHECKING:
    from reasonrl.data.prompts import PromptEncoder

ARITHMETIC = "arithmetic"


@dataclass(frozen=True)
class DataSpec:
    """The data settings a source needs (mirrors the ``data`` config group)."""

    dataset: str = ARITHMETIC
    eval_dataset: str | None = None
    arithmetic_digits: int = 2
    arithmetic_operations: str = "+"
    fields: Fields = field(default_factory=Fields)
    task_mix: tuple[str, ...] = ()


class TrainingStream:
    """An endless, seeded sequence of training examples; its position is its whole state.

    Finite datasets are reshuffled every epoch with a seed derived from (seed, epoch), so
    ``take`` after ``load_state_dict`` continues exactly where a checkpoint left off.  With a
    task-mix schedule (``data.task_mix``) a ``TaskMixSampler`` picks the task type of every draw.
    """

    def __init__(self, spec: DataSpec, seed: int) -> None:
        self.seed = seed
        self.consumed = 0
        self._task: ArithmeticTask | None = None
        self._rows: list[Example] = []
        self._mix: TaskMixSampler | None = None
        if spec.dataset == ARITHMETIC:
            self._task = ArithmeticTask(spec.arithmetic_digits, spec.arithmetic_operations, seed)
        else:
            self._rows = training_examples(spec)
        if spec.task_mix:
            if self._task is not None:
                raise DataError("data.task_mix needs a dataset with several task types, not the arithmetic task")
            types = sorted({row.task_type for row in self._rows})
            self._mix = TaskMixSampler(self._rows, parse_task_mix(spec.task_mix, types), seed)
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

    def take(self, count: int, step: int = 0) -> list[Example]:
        """The next ``count`` examples (``step`` selects the task-mix phase, when there is a schedule)."""
        if self._mix is not None:
            examples = self._mix.take(count, step)
        else:
            examples = [self._row(self.consumed + i) for i in range(count)]
        self.consumed += count
        return examples

    def peek(self, count: int, step: int = 0) -> list[Example]:
        """The examples the next ``take(count, step)`` returns, without moving the stream."""
        state = self.state_dict()
        examples = self.take(count, step)
        self.load_state_dict(state)
        return examples

    def state_dict(self) -> dict:
        """The stream position (for checkpoints)."""
        return {"consumed": self.consumed, **({"mix": self._mix.state_dict()} if self._mix is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved position."""
        self.consumed = int(state["consumed"])
        if self._mix is not None:
            self._mix.load_state_dict(state["mix"])


MIXTURE_SEPARATOR = "+"  # data.dataset=gsm8k+mbpp trains on both


def _single_split(source: str, fields: Fields) -> list[Example]:
    return load_examples(source, "test" if has_split(source, "test") else "train", fields)


def check_sources(spec: DataSpec) -> None:
    """Fail fast on a dataset name that is not built in, not a file and not a hub id (nothing is loaded)."""
    for source in (spec.dataset, spec.eval_dataset or ""):
        for name in filter(None, source.split(MIXTURE_SEPARATOR)):
            check_dataset_name(name)


def training_examples(spec: DataSpec) -> list[Example]:
    """Rows to train on: the train split, or a single-split source minus its hold-out (unless a
    separate eval source is given).  ``a+b`` concatenates the training rows of several sources."""
    sources = spec.dataset.split(MIXTURE_SEPARATOR)
    if len(sources) > 1:
        if ARITHMETIC in sources:
            raise DataError("the arithmetic task is endless and cannot be mixed with other datasets")
        return [row for source in sources for row in training_examples(replace(spec, dataset=source))]
    if has_split(spec.dataset, "train"):
        return load_examples(spec.dataset, "train", spec.fields)
    rows = _single_split(spec.dataset, spec.fields)
    return rows if spec.eval_dataset else [row for index, row in enumerate(rows) if not in_holdout(index)]


def eval_examples(spec: DataSpec, count: int) -> list[Example]:
    """The first ``count`` held-out examples of a run, disjoint from its training rows (of a mixture,
    ``count`` split evenly between its sources, interleaved)."""
    source = spec.eval_dataset or spec.dataset
    parts = source.split(MIXTURE_SEPARATOR)
    if len(parts) > 1:
        shares = [count // len(parts) + (i < count % len(parts)) for i in range(len(parts))]
        lists = [
            eval_examples(replace(spec, dataset=p, eval_dataset=None), n) for p, n in zip(parts, shares, strict=True)
        ]
        return [row for group in zip_longest(*lists) for row in group if row is not None]
    if spec.eval_dataset is None and source != ARITHMETIC and not has_split(source, "train"):
        return [row for index, row in enumerate(_single_split(source, spec.fields)) if in_holdout(index)][:count]
    return benchmark_examples(source, count, spec)


def benchmark_examples(source: str, count: int | None, spec: DataSpec = DataSpec()) -> list[Example]:
    """Examples to evaluate on: the arithmetic eval split, a built-in test split, or every row of a file."""
    if source == ARITHMETIC:
        return ArithmeticTask(spec.arithmetic_digits, spec.arithmetic_operations).eval_examples(count or 200)
    rows = _single_split(source, spec.fields)
    return rows if count is None else rows[:count]


# --- checks at a run's start, before any model loads --------------------------------------------------------

PROMPT_SAMPLE = 64
"""How many of the training prompts a run draws first are measured against rollout.max_prompt_tokens at its start."""


def prompt_length(encoder: PromptEncoder, example: Example) -> int:
    """The tokens of ``example``'s prompt as ``encoder`` renders it (chat template included), without the
    encoder's cache or its warning about a prompt over the cap."""
    from reasonrl.data.prompts import chat_token_ids  # (imports torch, which naming the data does not need)

    return len(chat_token_ids(encoder.tokenizer, encoder.messages(example), encoder.tools))


def check_prompt_lengths(stream: TrainingStream, encoder: PromptEncoder) -> str | None:
    """Measure the first PROMPT_SAMPLE prompts ``stream`` will give (text prompts; it is not moved): a DataError
    when most are longer than the encoder's cap (the run would skip nearly every prompt), a warning line when
    some are, else None."""
    sample = {e.id: e for e in stream.peek(PROMPT_SAMPLE) if not e.images}.values()
    lengths = [prompt_length(encoder, e) for e in sample]
    cap = encoder.max_prompt_tokens
    over = sum(n > cap for n in lengths)
    if not over:
        return None
    longest, median = max(lengths), statistics.median_low(lengths)
    measured = f"{over} of the first {len(lengths)} training prompts"
    if 2 * over > len(lengths):
        raise DataError(
            f"{measured} are longer than rollout.max_prompt_tokens={cap} (median {median}, longest {longest} tokens, "
            f"chat template included) and would be skipped; set rollout.max_prompt_tokens={longest} to fit them"
        )
    return (
        f"{measured} ({over / len(lengths):.0%}) are longer than rollout.max_prompt_tokens={cap} (longest {longest} "
        f"tokens) and will be skipped; rollout.max_prompt_tokens={longest} keeps them"
    )


def held_out_source(spec: DataSpec) -> str:
    """Where a run's held-out prompts come from, as a message names it."""
    if spec.eval_dataset:
        return f"data.eval_dataset={spec.eval_dataset}"
    if spec.dataset == ARITHMETIC:
        return "the arithmetic task's held-out problems"
    if MIXTURE_SEPARATOR not in spec.dataset and has_split(spec.dataset, "train"):
        return f"the test split of data.dataset={spec.dataset}"
    return f"the hold-out of data.dataset={spec.dataset} (one row in {HOLDOUT_BUCKETS}, by position)"


def check_held_out(spec: DataSpec, count: int, encoder: PromptEncoder) -> tuple[bool, str] | None:
    """What a run's start says of its held-out evaluation of ``count`` prompts (data.eval_prompts): (True, a
    warning) when no prompt is left to evaluate, (False, a notice) when fewer than ``count``, else None."""
    if count == 0:  # the user skips the evaluation
        return None
    held = eval_examples(spec, count)
    cap = encoder.max_prompt_tokens
    lengths = [0 if e.images else prompt_length(encoder, e) for e in held]
    kept = sum(n <= cap for n in lengths)
    where = held_out_source(spec)
    if not held:
        return True, (
            f"no held-out prompt to evaluate on: {where} is empty, so the held-out accuracy would be measured on "
            f"0 prompts; give held-out rows with data.eval_dataset, at least {HOLDOUT_BUCKETS} rows in data.dataset, "
            "or set data.eval_prompts=0 to skip the evaluation"
        )
    if not kept:
        return True, (
            f"all {len(held)} held-out prompts ({where}) are longer than rollout.max_prompt_tokens={cap} (longest "
            f"{max(lengths)} tokens), so the held-out accuracy would be measured on 0 prompts; set "
            f"rollout.max_prompt_tokens={max(lengths)}, or data.eval_prompts=0 to skip the evaluation"
        )
    if kept < count:
        too_long = (
            f", {len(held) - kept} of them longer than rollout.max_prompt_tokens={cap}" if kept < len(held) else ""
        )
        notice = f"the held-out evaluation uses {kept} prompts, not data.eval_prompts={count}: {where} holds"
        return False, f"{notice} {len(held)}{too_long}"
    return None
