"""Code tasks: HumanEval and MBPP rows as ``Example``s (task_type "code") scored by the code verifier.

Each example's ``question`` is the problem with an instruction to answer in a ```python block;
its ``answer`` is the reference the code verifier (``reasonrl.reward.code``) reads: the test program, the
entry point and, for HumanEval, the prompt as context.

Reference encoding (the ``answer`` of an ``Example`` with ``task_type="code"``): a JSON object

    {"tests": "<test program>", "entry_point": "<function name or null>", "context": "<code>"}

``tests`` is a test program as ``reasonrl.reward.testcases`` splits it (top-level asserts, or
HumanEval's ``def check(candidate)`` plus ``check(entry_point)``); ``entry_point`` names the
function under test; ``context`` is task code (HumanEval's prompt: imports, helpers, the signature)
that runs before the solution and, as trusted helpers, before the tests.  ``entry_point`` and
``context`` may be left out.  A reference that is not a JSON object is the test program itself.
``code_reference`` writes this encoding.

MBPP splits follow the upstream README and the Hugging Face ``mbpp`` dataset: task ids 1-10
``prompt`` (few-shot), 11-510 ``test``, 511-600 ``validation``, 601-974 ``train``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from reasonrl.data.examples import Example, RowError

INSTRUCTION = "Answer with the complete Python function in a single ```python code block."
MBPP_SPLITS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601), "train": range(601, 975)}


def code_reference(tests: str, entry_point: str | None = None, context: str = "") -> str:
    """The reference string of a code task (see the module docstring)."""
    return json.dumps({"tests": tests, "entry_point": entry_point, "context": context})


def parse_reference(reference: str) -> tuple[str, str | None, str]:
    """(tests, entry_point, context) of a reference string."""
    try:
        data = json.loads(reference)
    except ValueError:
        return reference, None, ""
    if not isinstance(data, dict):
        return reference, None, ""
    tests, entry_point, context = data.get("tests"), data.get("entry_point"), data.get("context") or ""
    if not isinstance(tests, str) or not isinstance(context, str) or not isinstance(entry_point, str | None):
        raise ValueError("a code reference needs 'tests' (str), optional 'entry_point' (str) and 'context' (str)")
    return tests, entry_point, context


def _require(location: str, row: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise RowError(f"{location}: no field {', '.join(repr(k) for k in missing)} in a code-task row")


def humaneval_example(split: str, location: str, row: dict[str, Any], index: int) -> Example:
    """A HumanEval row: complete ``prompt``; the tests are ``check(entry_point)`` of its ``test`` field."""
    _require(location, row, "prompt", "test", "entry_point")
    prompt, entry_point = row["prompt"], row["entry_point"]
    question = f"Complete the following Python function.\n\n```python\n{prompt.strip()}\n```\n\n{INSTRUCTION}"
    tests = f"{row['test']}\n\ncheck({entry_point})\n"
    return Example(f"humaneval:{index}", question, code_reference(tests, entry_point, prompt), task_type="code")


def entry_point_of(tests: list[str], code: str = "") -> str | None:
    """The function MBPP's asserts test: the first called name that ``code`` defines, else the first called."""
    defined = set(re.findall(r"^\s*def\s+(\w+)", code, re.MULTILINE))
    called = []
    for test in tests:
        try:
            tree = ast.parse(test.strip())
        except SyntaxError:
            continue
        called += [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return next((name for name in called if name in defined), called[0] if called else None)


def mbpp_example(split: str, location: str, row: dict[str, Any], index: int) -> Example | None:
    """An MBPP row of ``split`` (None for rows of other splits): ``text`` and its three asserts."""
    _require(location, row, "task_id", "text", "test_list")
    if int(row["task_id"]) not in MBPP_SPLITS[split]:
        return None
    asserts = [t.strip() for t in row["test_list"]]
    question = f"{row['text'].strip()}\nYour code should pass these tests:\n\n" + "\n".join(asserts)
    setup = row.get("test_setup_code") or ""
    reference = code_reference(f"{setup}\n" + "\n".join(asserts) + "\n", entry_point_of(asserts, row.get("code", "")))
    return Example(f"mbpp:{row['task_id']}", f"{question}\n\n{INSTRUCTION}", reference, task_type="code")
