"""The generated functions task: fixed, disjoint splits of code problems whose tests a right answer passes."""

import re

from reasonrl.data.functions import TEMPLATES
from reasonrl.data.loaders import load_examples
from reasonrl.reward.code import CodeVerifier

# a right answer per template, by its name's prefix
SOLUTIONS = {
    "add": "return x + {k}",
    "times": "return x * {k}",
    "minus": "return x - {k}",
    "square_plus": "return x * x + {k}",
    "is_multiple_of": "return x % {k} == 0",
    "count_above": "return sum(v > {k} for v in xs)",
    "sum_plus": "return sum(xs) + {k}",
    "max_times": "return max(xs) * {k}",
    "repeat": "return s * {k}",
    "first": "return s[:{k}]",
}


def signature(example):
    return re.search(r"`((\w+?)_?(\d+)(?:_chars)?)\((\w+)\)`", example.question)


def test_the_splits_are_fixed_disjoint_and_code_tasks():
    train, test = load_examples("functions", "train"), load_examples("functions", "test")
    assert len(train) == 2000 and len(test) == 200
    assert [e.question for e in test] == [e.question for e in load_examples("functions", "test")]
    names = {split: {signature(e).group(1) for e in rows} for split, rows in (("train", train), ("test", test))}
    assert not names["train"] & names["test"]  # no function of the test split is ever trained on
    assert {e.task_type for e in train + test} == {"code"} and len({e.id for e in train + test}) == 2200
    assert len({signature(e).group(2) for e in test}) >= len(TEMPLATES) - 2  # most templates in both splits


def test_a_right_answer_passes_and_a_wrong_one_fails():
    verifier = CodeVerifier()
    for example in load_examples("functions", "test")[:12]:
        name, stem, k, parameter = signature(example).groups()
        body = SOLUTIONS[stem.split("_")[0] if stem.startswith("first") else stem].format(k=k)
        right = f"```python\ndef {name}({parameter}):\n    {body}\n```"
        assert verifier(right, example.answer).correct, example.question
        assert not verifier(f"```python\ndef {name}({parameter}):\n    return None\n```", example.answer).correct
