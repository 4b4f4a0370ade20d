"""A generated code task: one-line Python functions with unit tests, seeded like the arithmetic task.

MBPP is too hard for a 135M model to give RL on code a signal (docs/benchmarks.md); on these problems
("Write a Python function `add_7(x)` that returns x plus 7.", with three asserts) SmolLM2-135M-Instruct
starts at 47% greedy pass@1 (docs/benchmarks.md, "Process rewards for code"), in the range RL can move.
Each problem is a template and its constants; a problem belongs to the test split when a stable hash
of its function's name falls in the held-out bucket (1 in 5), so no test function is ever trained on.
Rows are code tasks (``task_type="code"``) in MBPP's format: the description, the asserts, and the
instruction to answer with a code block.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.data.code_tasks import INSTRUCTION, code_reference, entry_point_of
from reasonrl.data.examples import Example

TRAIN_PROBLEMS, TEST_PROBLEMS = 2000, 200
HELD_OUT_BUCKETS = 5
WORDS = ("apple", "river", "stone", "python", "banana", "cloud", "orange", "level", "tiger", "music")


@dataclass(frozen=True)
class Template:
    """A family of problems: its function name and description for constant k, the reference
    function, and how to draw a test input."""

    name: str  # with {k} (the constant) or {c} (the letter LETTERS[k])
    description: str  # likewise
    reference: Callable[[object, int], object]  # (input, k) -> output
    draw_input: Callable[[random.Random], object]
    constants: range


def _ints(rng: random.Random) -> int:
    return rng.randint(-20, 50)


def _int_list(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 30) for _ in range(rng.randint(1, 6))]


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


LETTERS = "aeiost"
TEMPLATES = (
    Template("add_{k}", "returns x plus {k}", lambda x, k: x + k, _ints, range(2, 30)),
    Template("minus_{k}", "returns x minus {k}", lambda x, k: x - k, _ints, range(2, 30)),
    Template("square_plus_{k}", "returns the square of x plus {k}", lambda x, k: x * x + k, _ints, range(0, 10)),
    Template("power_{k}", "returns x raised to the power {k}", lambda x, k: x**k, _ints, range(2, 6)),
    Template(
        "is_multiple_of_{k}",
        "returns True if x is divisible by {k}, else False",
        lambda x, k: x % k == 0,
        _ints,
        range(2, 10),
    ),
    Template(
        "count_above_{k}",
        "returns how many numbers in the list xs are greater than {k}",
        lambda xs, k: sum(v > k for v in xs),
        _int_list,
        range(0, 20),
    ),
    Template(
        "count_divisible_by_{k}",
        "returns how many numbers in the list xs are divisible by {k}",
        lambda xs, k: sum(v % k == 0 for v in xs),
        _int_list,
        range(2, 8),
    ),
    Template(
        "sum_plus_{k}", "returns the sum of the list xs plus {k}", lambda xs, k: sum(xs) + k, _int_list, range(0, 20)
    ),
    Template(
        "max_times_{k}",
        "returns the largest number in the list xs multiplied by {k}",
        lambda xs, k: max(xs) * k,
        _int_list,
        range(1, 10),
    ),
    Template(
        "scale_by_{k}",
        "returns a new list with every number of the list xs multiplied by {k}",
        lambda xs, k: [v * k for v in xs],
        _int_list,
        range(2, 10),
    ),
    Template(
        "last_{k}_items", "returns the last {k} elements of the list xs", lambda xs, k: xs[-k:], _int_list, range(1, 5)
    ),
    Template(
        "first_{k}_chars", "returns the first {k} characters of the string s", lambda s, k: s[:k], _word, range(1, 6)
    ),
    Template(
        "count_{c}",
        "returns how many times the letter '{c}' appears in the string s",
        lambda s, k: s.count(LETTERS[k]),
        _word,
        range(len(LETTERS)),
    ),
    Template(
        "longer_than_{k}",
        "returns True if the string s has more than {k} characters, else False",
        lambda s, k: len(s) > k,
        _word,
        range(3, 7),
    ),
)


def _parameter(template: Template) -> str:
    sample = template.draw_input(random.Random(0))
    return "xs" if isinstance(sample, list) else "s" if isinstance(sample, str) else "x"


def _held_out(name: str) -> bool:
    return int(hashlib.sha256(f"functions:{name}".encode()).hexdigest(), 16) % HELD_OUT_BUCKETS == 0


def problem(template: Template, k: int, rng: random.Random, problem_id: str) -> Example:
    """One problem: ``template`` with constant ``k``, three asserts on inputs drawn from ``rng``."""
    name = template.name.format(k=k, c=LETTERS[k % len(LETTERS)])
    parameter = _parameter(template)
    inputs: list = []
    while len(inputs) < 3:
        value = template.draw_input(rng)
        if value not in inputs:
            inputs.append(value)
    asserts = [f"assert {name}({value!r}) == {template.reference(value, k)!r}" for value in inputs]
    description = template.description.format(k=k, c=LETTERS[k % len(LETTERS)])
    description = f"Write a Python function `{name}({parameter})` that {description}."
    question = f"{description}\nYour code should pass these tests:\n\n" + "\n".join(asserts)
    reference = code_reference("\n".join(asserts) + "\n", entry_point_of(asserts))
    return Example(problem_id, f"{question}\n\n{INSTRUCTION}", reference, task_type="code", data_source="functions")


def function_examples(split: str) -> list[Example]:
    """The ``train`` (2000) or ``test`` (200) problems: every (template, k) belongs to one split; each
    problem draws a template (uniformly, among those with constants in the split), a constant of it, and
    fresh test inputs; the same problems every time."""
    held_out = split == "test"
    constants = {
        t: [k for k in t.constants if _held_out(t.name.format(k=k, c=LETTERS[k % len(LETTERS)])) == held_out]
        for t in TEMPLATES
    }
    templates = [t for t in TEMPLATES if constants[t]]
    rng = random.Random(f"functions:{split}")
    count = TEST_PROBLEMS if held_out else TRAIN_PROBLEMS
    chosen = [rng.choice(templates) for _ in range(count)]
    return [problem(t, rng.choice(constants[t]), rng, f"functions:{split}:{i}") for i, t in enumerate(chosen)]
