"""The generated functions task: fixed, disjoint splits of code problems whose tests a right answer passes."""

import re

from reasonrl.data.functions import TEMPLATES
from reasonrl.data.loaders import load_examples
from reasonrl.reward.code import CodeVerifier

# a right answer per template: (name pattern, body with the name's constant)
SOLUTIONS = [
    (r"add_(\d+)", "return x + {0}"),
    (r"minus_(\d+)", "return x - {0}"),
    (r"square_plus_(\d+)", "return x * x + {0}"),
    (r"power_(\d+)", "return x ** {0}"),
    (r"is_multiple_of_(\d+)", "return x % {0} == 0"),
    (r"count_above_(\d+)", "return sum(v > {0} for v in xs)"),
    (r"count_divisible_by_(\d+)", "return sum(v % {0} == 0 for v in xs)"),
    (r"sum_plus_(\d+)", "return sum(xs) + {0}"),
    (r"max_times_(\d+)", "return max(xs) * {0}"),
    (r"scale_by_(\d+)", "return [v * {0} for v in xs]"),
    (r"last_(\d+)_items", "return xs[-{0}:]"),
    (r"first_(\d+)_chars", "return s[:{0}]"),
    (r"count_([a-z])", "return s.count('{0}')"),
    (r"longer_than_(\d+)", "return len(s) > {0}"),
]


def signature(example) -> tuple[str, str]:
    """(function name, parameter) of a problem."""
    return re.search(r"`(\w+)\((\w+)\)`", example.question).groups()


def right_answer(name: str, parameter: str) -> str:
    pattern, body = next((p, b) for p, b in SOLUTIONS if re.fullmatch(p, name))
    return f"```python\ndef {name}({parameter}):\n    {body.format(*re.fullmatch(pattern, name).groups())}\n```"


def test_the_splits_are_fixed_disjoint_and_code_tasks():
    train, test = load_examples("functions", "train"), load_examples("functions", "test")
    assert len(train) == 2000 and len(test) == 200
    assert [e.question for e in test] == [e.question for e in load_examples("functions", "test")]
    names = {split: {signature(e)[0] for e in rows} for split, rows in (("train", train), ("test", test))}
    assert not names["train"] & names["test"]  # no function of the test split is ever trained on
    assert {e.task_type for e in train + test} == {"code"} and len({e.id for e in train + test}) == 2200
    assert len(SOLUTIONS) == len(TEMPLATES)


def test_a_right_answer_passes_and_a_wrong_one_fails():
    verifier = CodeVerifier()
    train = load_examples("functions", "train")
    one_per_template = {next(p for p, _ in SOLUTIONS if re.fullmatch(p, signature(e)[0])): e for e in train}
    assert len(one_per_template) == len(TEMPLATES)
    for example in [*one_per_template.values(), *load_examples("functions", "test")[:6]]:
        name, parameter = signature(example)
        assert verifier(right_answer(name, parameter), example.answer).correct, example.question
        wrong = f"```python\ndef {name}({parameter}):\n    return None\n```"
        assert not verifier(wrong, example.answer).correct, example.question
