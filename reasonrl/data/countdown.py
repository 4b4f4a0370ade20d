"""Countdown, "reach the target number": seeded puzzles, and the exact, safe arithmetic that checks answers.

A puzzle gives 3 or 4 numbers (1 to 25) and a target; an answer is an arithmetic expression over the
numbers, each used at most once, with + - * / and parentheses, that equals the target exactly (in
fractions: 6 / 4 * 2 is 3).  Every puzzle can be solved: its target is the value of an expression over
some of its numbers.  The answer is the last ``<answer>...</answer>`` of the response (TinyZero's Countdown
format).  The rows are fixed (puzzle i of the sequence seeded "countdown:i"); a puzzle belongs to the test
split when a stable hash of its numbers and target falls in the held-out bucket (1 in 5), so no test
puzzle is ever trained on.  Each row is an ``Example`` of ``task_type="countdown"`` whose reference
answer is the puzzle as JSON.

Generated text is never run by Python: ``parse_arithmetic`` reads it with ``ast`` and accepts only numbers,
the four operators, a sign and parentheses, in at most ``MAX_EXPRESSION_CHARS`` characters; ``evaluate``
walks that tree alone.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from reasonrl.data.examples import Example

MAX_EXPRESSION_CHARS = 200
TRAIN_PUZZLES, TEST_PUZZLES = 2000, 200
HELD_OUT_BUCKETS = 5
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
SIGNS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
ARITHMETIC_NODES = (ast.BinOp, ast.UnaryOp, *OPERATORS, *SIGNS)  # with number constants: all a tree may hold
ANSWER = ("<answer>", "</answer>")


class ExpressionError(ValueError):
    """Text that is not an arithmetic expression the calculator accepts, or whose value is undefined."""


def parse_arithmetic(expression: str) -> ast.expr:
    """The syntax tree of ``expression``, which must be numbers, + - * /, signs and parentheses only, in at
    most MAX_EXPRESSION_CHARS characters; raises ExpressionError otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"an expression is at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep parentheses, a null byte, ...
        raise ExpressionError("not an arithmetic expression") from None
    for node in ast.walk(tree):
        number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
        if not (number or isinstance(node, ARITHMETIC_NODES)):
            raise ExpressionError("only numbers, + - * / and parentheses are allowed")
    return tree


def evaluate(tree: ast.expr) -> Fraction:
    """The exact value of a tree ``parse_arithmetic`` accepted; raises ExpressionError on a division by zero
    or a number that is not finite."""
    if isinstance(tree, ast.Constant):
        try:
            return Fraction(repr(tree.value))  # the decimal as written: 0.1 is 1/10
        except ValueError:  # 1e999 reads as inf
            raise ExpressionError("a number is too large") from None
    if isinstance(tree, ast.UnaryOp):
        return SIGNS[type(tree.op)](evaluate(tree.operand))
    assert isinstance(tree, ast.BinOp)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if isinstance(tree.op, ast.Div) and right == 0:
        raise ExpressionError("division by zero")
    return OPERATORS[type(tree.op)](left, right)


def calculate(expression: str) -> str:
    """The calculator's answer: the exact value of ``expression`` (a whole number, or a fraction such as 7/3);
    raises ExpressionError for anything but arithmetic."""
    value = evaluate(parse_arithmetic(expression))
    try:
        return str(value)
    except ValueError:  # more digits than Python writes out
        raise ExpressionError("the value is too large to write out") from None


def final_answer(text: str) -> str | None:
    """What the last ``<answer>...</answer>`` of ``text`` holds, or None (two string searches, linear time)."""
    end = text.rfind(ANSWER[1])
    start = text.rfind(ANSWER[0], 0, max(end, 0))
    return None if end < 0 or start < 0 else text[start + len(ANSWER[0]) : end]


@dataclass(frozen=True)
class Puzzle:
    """Numbers to combine, each at most once, and the target to reach."""

    numbers: tuple[int, ...]
    target: int

    @staticmethod
    def from_reference(reference: str) -> Puzzle:
        """The puzzle of a row's reference answer (``reference``'s JSON)."""
        fields = json.loads(reference)
        return Puzzle(tuple(int(n) for n in fields["numbers"]), int(fields["target"]))

    @property
    def reference(self) -> str:
        return json.dumps({"numbers": list(self.numbers), "target": self.target})

    @property
    def question(self) -> str:
        numbers = ", ".join(map(str, self.numbers))
        return (
            f"Using the numbers {numbers}, each at most once, and + - * / with parentheses, write an expression "
            f"that equals {self.target}. Give the expression as <answer>expression</answer>."
        )

    def solved_by(self, response: str) -> bool:
        """Whether the last ``<answer>`` of ``response`` is an expression of whole numbers from the puzzle, each
        used at most as often as given, whose value is the target."""
        answer = final_answer(response)
        if answer is None:
            return False
        try:
            tree = parse_arithmetic(answer)
            used = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]
            if any(type(n) is not int for n in used) or Counter(used) - Counter(self.numbers):
                return False
            return evaluate(tree) == self.target
        except ExpressionError:
            return False


def _puzzle(rng: random.Random) -> Puzzle:
    """A solvable puzzle: numbers, and as target the value of some of them combined left to right."""
    numbers = tuple(rng.randint(1, 25) for _ in range(rng.choice((3, 4))))
    while True:
        used = rng.sample(numbers, rng.randint(2, len(numbers)))
        value = Fraction(used[0])
        for number in used[1:]:
            value = OPERATORS[rng.choice(list(OPERATORS))](value, Fraction(number))
        if value.denominator == 1 and 1 <= value <= 250:
            return Puzzle(numbers, int(value))


def held_out(puzzle: Puzzle) -> bool:
    """Whether ``puzzle`` belongs to the test split (by a stable hash of its sorted numbers and target)."""
    key = f"{sorted(puzzle.numbers)}:{puzzle.target}"
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % HELD_OUT_BUCKETS == 0


def countdown_examples(split: str) -> list[Example]:
    """The ``train`` (TRAIN_PUZZLES) or ``test`` (TEST_PUZZLES) rows, the same on every call."""
    test = split == "test"
    wanted, rows, index = (TEST_PUZZLES if test else TRAIN_PUZZLES), [], 0
    while len(rows) < wanted:
        puzzle = _puzzle(random.Random(f"countdown:{index}"))
        if held_out(puzzle) == test:
            identifier = f"countdown:{split}:{len(rows)}"
            rows.append(Example(identifier, puzzle.question, puzzle.reference, "countdown", data_source="countdown"))
        index += 1
    return rows
