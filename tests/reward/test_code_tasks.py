"""Code tasks (built-in HumanEval and MBPP) and the code verifier, with a reason per row."""

import json
import pickle
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from reasonrl.data.code_tasks import code_reference, entry_point_of, parse_reference
from reasonrl.data.loaders import load_examples, read_rows
from reasonrl.reward.code import CodeVerifier, build_program, extract_code
from reasonrl.reward.scoring_pool import ScoringPool

VERIFIER = CodeVerifier(timeout_s=3.0, total_timeout_s=20.0, memory_mb=512)


def builtin_rows(name: str) -> dict[str, dict]:
    path = Path(str(resources.files("reasonrl.data") / "builtin" / name))
    return {str(row.get("task_id")): row for _, row in read_rows(path)}


HUMANEVAL = builtin_rows("humaneval-test.jsonl.gz")
MBPP = builtin_rows("mbpp.jsonl.gz")


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n\nIt runs in linear time."


def test_builtin_code_datasets_load_offline():
    humaneval = load_examples("humaneval", "test")
    assert len(humaneval) == 164 and {e.task_type for e in humaneval} == {"code"}
    assert humaneval[0].id == "humaneval:0" and "def has_close_elements" in humaneval[0].question
    tests, entry_point, context = parse_reference(humaneval[0].answer)
    assert entry_point == "has_close_elements" and "def check(candidate)" in tests
    assert tests.rstrip().endswith("check(has_close_elements)") and context == HUMANEVAL["HumanEval/0"]["prompt"]
    sizes = {split: len(load_examples("mbpp", split)) for split in ("train", "test", "validation", "prompt")}
    assert sizes == {"train": 374, "test": 500, "validation": 90, "prompt": 10}
    mbpp = load_examples("mbpp", "test")[0]
    assert mbpp.id == "mbpp:11" and mbpp.task_type == "code"
    assert 'assert remove_Occ("hello","l") == "heo"' in mbpp.question
    assert parse_reference(mbpp.answer)[1] == "remove_Occ"


# (HumanEval task, why it is in the table)
HUMANEVAL_CASES = [
    ("HumanEval/0", "the first task: list of floats in, bool out"),
    ("HumanEval/10", "two functions in the prompt, the helper is used by the solution"),
    ("HumanEval/32", "the test calls the prompt's helper poly() in a 100-iteration loop"),
    ("HumanEval/38", "the test encodes with the prompt's encode_cyclic, the solution decodes"),
    ("HumanEval/53", "the test draws random inputs (import random inside check)"),
]


@pytest.mark.parametrize("task, why", HUMANEVAL_CASES, ids=[c[0] for c in HUMANEVAL_CASES])
def test_humaneval_canonical_solutions_pass(task, why):
    row = HUMANEVAL[task]
    reference = code_reference(f"{row['test']}\ncheck({row['entry_point']})\n", row["entry_point"], row["prompt"])
    result = VERIFIER(fenced(row["prompt"] + row["canonical_solution"]), reference)
    assert result.correct and result.score == 1.0, (why, result.info)


def test_humaneval_completion_only_response_continues_the_prompt():
    row = HUMANEVAL["HumanEval/2"]
    reference = code_reference(f"{row['test']}\ncheck({row['entry_point']})\n", row["entry_point"], row["prompt"])
    result = VERIFIER(row["canonical_solution"], reference)  # an indented body, as upstream completions are
    assert result.correct and result.info["extraction"] == "raw"


# (MBPP task_id, why it is in the table)
MBPP_CASES = [
    ("11", "the first test task"),
    ("17", "a one-line arithmetic function"),
    ("367", "test_setup_code builds trees of the solution's Node class: objects cross as handles"),
    ("533", "a type (int) is an argument: built-in types cross by name"),
    ("596", "the tests use sys, which only the solution imports: the judge gives the test its own"),
    ("601", "the test builds a list of the solution's Pair objects"),
]


@pytest.mark.parametrize("task, why", MBPP_CASES, ids=[f"mbpp-{c[0]}" for c in MBPP_CASES])
def test_mbpp_canonical_solutions_pass(task, why):
    row = MBPP[task]
    tests = f"{row['test_setup_code']}\n" + "\n".join(row["test_list"])
    reference = code_reference(tests, entry_point_of(row["test_list"], row["code"]))
    result = VERIFIER(fenced(row["code"]), reference)
    assert result.correct and result.score == 1.0, (why, result.info)


def test_the_shipped_examples_score_their_own_canonical_solutions():
    example = next(e for e in load_examples("mbpp", "train") if e.id == "mbpp:601")
    result = VERIFIER(fenced(MBPP["601"]["code"]), example.answer)
    assert result.correct, result.info


# (response, expected score, why)
MAX_REFERENCE = code_reference(
    "assert biggest([5, 1, 2]) == 5\nassert biggest([-3, -1]) == -1\nassert biggest([7]) == 7\n"
    "assert biggest([0, 0, 4]) == 4\n",
    "biggest",
)
VERIFIER_TABLE = [
    ("", 0.0, "an empty response has no code"),
    ("```python\n```", 0.0, "an empty code block"),
    ("I am not sure how to solve this.", 0.0, "prose only: the program does not define the function"),
    (fenced("def biggest(xs):\n    pass"), 0.0, "a stub returns None"),
    (fenced("def biggest(xs):\n    return xs[0]"), 0.5, "first element: right for 2 of 4 lists"),
    (fenced("def biggest(xs):\n    return max(xs)"), 1.0, "correct"),
    (fenced("def biggest(xs):\n    return max(xs)\n\nprint(biggest([1]))"), 1.0, "prints while loading: fine"),
    ("def biggest(xs):\n    return max(xs)", 1.0, "raw code without a fence"),
    ("Sure:\ndef biggest(xs):\n    return max(xs)", 1.0, "raw code after a line of prose"),
    (fenced("def biggest(xs)\n    return max(xs)"), 0.0, "a syntax error fails every test"),
    (fenced("import sys\nsys.exit(0)"), 0.0, "exiting before the tests is a failure"),
    ("```python\ndef biggest(xs):\n    return max(xs)\n", 1.0, "an unterminated fence (truncated response)"),
    ("def biggest(xs):\n    return max(xs)\0", 0.0, "a null byte: ast.parse's ValueError is a failure, not a crash"),
    ("x = " + "(" * 300 + ")" * 300 + "\ndef biggest(xs):\n    return max(xs)", 1.0, "nesting too deep to parse"),
    ("Sure:\n" + "-(" * 100_000, 0.0, "nesting that overflows the parser's recursion"),
]


@pytest.mark.parametrize("response, score, why", VERIFIER_TABLE, ids=[row[2] for row in VERIFIER_TABLE])
def test_code_verifier_table(response, score, why):
    result = VERIFIER(response, MAX_REFERENCE)
    assert result.score == pytest.approx(score), (why, result.info)
    assert result.correct == (score == 1.0)


def test_extraction_picks_the_block_that_defines_the_entry_point():
    response = (
        "```python\ndef helper():\n    return 1\n```\n```python\ndef solve(x):\n    return x\n```\n"
        "Usage:\n```python\nprint(solve(3))\n```\n```bash\npython solve.py\n```"
    )
    assert extract_code(response, "solve") == ("def solve(x):\n    return x\n", "fenced")
    assert extract_code(response)[0] == "print(solve(3))\n"  # no entry point: the last python block
    assert extract_code("```bash\nls\n```") == ("", "none")
    assert build_program("    return 1\n", "f", "def f():\n") == "def f():\n    return 1\n"
    assert build_program("def f():\n    return 1\n", "f", "import os\n") == "def f():\n    return 1\n"


def test_extraction_takes_linear_time_on_hostile_responses():
    hostile = ["\n" * 200_000 + "x", " " * 200_000, "```" + "a" * 200_000, "`" * 200_000, "```\n" * 50_000]
    start = time.monotonic()
    for response in hostile:
        extract_code(response, "f")
        build_program(response, "f", "def f():\n")
    assert time.monotonic() - start < 2  # quadratic patterns took minutes on these (1 s per 10k blank lines)


def test_references_are_json_or_bare_tests():
    assert parse_reference("assert f(1) == 1") == ("assert f(1) == 1", None, "")
    assert parse_reference(code_reference("assert f(1)", "f", "import os")) == ("assert f(1)", "f", "import os")
    with pytest.raises(ValueError, match="needs 'tests'"):
        parse_reference(json.dumps({"tests": 3}))
    result = VERIFIER(fenced("def f(x):\n    return x"), "assert f(1) == 1\nassert f(2) == 3")
    assert result.score == 0.5 and result.info["tests"] == 2


def test_code_verifier_is_picklable_and_runs_in_the_scoring_pool():
    verifier = pickle.loads(pickle.dumps(CodeVerifier(timeout_s=2.0)))
    with ScoringPool(verifier, workers=1, timeout=20) as pool:
        results = pool.score([(fenced("def biggest(xs):\n    return max(xs)"), MAX_REFERENCE), ("", MAX_REFERENCE)])
    assert [r.score for r in results] == [1.0, 0.0]
    assert results[0].info["status"] == "passed" and results[1].info["status"] == "no_code"


# The generic payload an outside red team used: it rewrites the child's request reader so that a test sent
# into the child becomes `pass`, and returns an object the codec cannot carry to get the test sent there.
# Before the fix it scored 1.0 on 80 of 80 real HumanEval and MBPP tasks.
FALLBACK_FORGERY = """
import sys
_main = sys.modules["__main__"]
_real = getattr(_main, "_receive", None)
def _forged(fd):
    request = _real(fd)
    if isinstance(request, dict) and request.get("op") == "inprocess":
        request = {**request, "setup": "", "test": "pass"}
    return request
_main._receive = _forged
class _Opaque:
    pass
def ENTRY(*args, **kwargs):
    return _Opaque()
"""


@pytest.mark.parametrize("task", ["HumanEval/0", "HumanEval/32", "mbpp:11", "mbpp:367", "mbpp:533", "mbpp:601"])
def test_the_fallback_forgery_scores_zero_on_real_tasks(task):
    if task.startswith("HumanEval"):
        row = HUMANEVAL[task]
        reference = code_reference(f"{row['test']}\ncheck({row['entry_point']})\n", row["entry_point"], row["prompt"])
    else:
        row = MBPP[task.split(":")[1]]
        tests = f"{row['test_setup_code']}\n" + "\n".join(row["test_list"])
        reference = code_reference(tests, entry_point_of(row["test_list"], row["code"]))
    result = VERIFIER(fenced(FALLBACK_FORGERY.replace("ENTRY", parse_reference(reference)[1])), reference)
    assert result.score == 0.0 and not result.correct, result.info


@pytest.mark.slow
def test_every_canonical_solution_passes():
    """HumanEval and MBPP canonical solutions, all 1,138 (about 2 minutes on 2 cores)."""
    script = Path(__file__).parents[2] / "bench" / "sandbox_canonical.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 1138 and summary["failures"] == [] and summary["pass_rate"] == 1.0
