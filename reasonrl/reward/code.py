"""The code verifier: take the program out of a response and run it against the task's tests in the sandbox.

The reference (the ``answer`` of an ``Example`` with ``task_type="code"``) holds the tests, the entry point
and the context: ``reasonrl.data.code_tasks`` describes its encoding and reads it (``parse_reference``).

Extraction: the last fenced block (```python, ```py or a bare ```) that defines the entry point,
else the last python-tagged block, else the last bare block; without a fence, the whole response
(from its first ``def``/``class``/``import`` line if the whole does not parse).  A block
that does not define the entry point and starts indented is taken as the continuation of the
context (a HumanEval completion); otherwise the context runs first and the block after it.

Score: the fraction of test cases passed; correct: all of them passed.
"""

from __future__ import annotations

import ast
import re

from reasonrl.data.code_tasks import parse_reference
from reasonrl.reward.sandbox import CodeJob, SandboxLimits, run_job
from reasonrl.reward.verifier_protocol import RewardResult

FENCE_TAG = re.compile(r"[ \t]*+([A-Za-z0-9_+.-]*+)")
PYTHON_TAGS = ("python", "py", "python3", "py3")


def defines(code: str, name: str | None) -> bool:
    """Whether a line of ``code`` starts ``def name(`` (linear time: the pattern cannot span lines)."""
    pattern = rf"^[ \t]*+(?:async[ \t]++)?def[ \t]++{re.escape(name or '')}[ \t]*+\("
    return bool(name) and re.search(pattern, code, re.MULTILINE) is not None


def extract_code(response: str, entry_point: str | None = None) -> tuple[str, str]:
    """(code, how): how is 'fenced', 'raw' (no code fence: the whole response) or 'none' (empty)."""
    blocks = [(tag, body) for tag, body in _fenced_blocks(response) if tag in ("", *PYTHON_TAGS)]
    if blocks:
        for wanted in (lambda t, b: defines(b, entry_point), lambda t, b: t != "", lambda t, b: True):
            chosen = [body for tag, body in blocks if wanted(tag, body)]
            if chosen:
                return chosen[-1], "fenced"
    if "```" in response or not response.strip():
        return "", "none"
    return _from_first_code_line(response), "raw"


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(lower-case tag, body) of each ```-fenced block, in order; an unclosed last block runs to the end.

    One pass with ``str.find`` (linear time whatever the response holds)."""
    blocks, position = [], 0
    while (start := text.find("```", position)) != -1:
        newline = text.find("\n", start + 3)
        if newline == -1:
            break
        tag = FENCE_TAG.match(text, start + 3, newline).group(1).lower()
        end = text.find("```", newline + 1)
        end = len(text) if end == -1 else end
        blocks.append((tag, text[newline + 1 : end]))
        position = end + 3
    return blocks


def _from_first_code_line(text: str) -> str:
    """``text``, or (if it does not parse) its tail from the first line that starts Python code."""
    if _parses(text):
        return text
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if re.match(r"(def|async def|class|import|from)\s", line):
            return "".join(lines[i:])
    return text


def _parses(text: str) -> bool:
    """Whether ``text`` is Python; False for anything ``ast.parse`` rejects (null bytes, nesting too deep...)."""
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def build_program(code: str, entry_point: str | None, context: str) -> str:
    """The solution the child runs after the context: the code, or context + code for a bare completion."""
    first = next((line for line in code.splitlines() if line.strip()), "")
    if context and not defines(code, entry_point) and first[:1] in (" ", "\t"):
        return context + code  # the body of the context's last function (HumanEval's completion format)
    return code


class CodeVerifier:
    """Runs the response's program against the reference's tests; score = pass fraction, correct = all pass.

    Picklable (it holds only its settings).  A run takes at most ``total_timeout_s`` plus the
    harness's 2 s grace: keep that under the scoring pool's per-call limit (``reward.timeout_seconds``,
    10 s by default), or the pool, not the sandbox, ends the call.
    """

    def __init__(
        self,
        timeout_s: float = 3.0,
        total_timeout_s: float = 7.0,
        memory_mb: int = 512,
        isolate_tests: bool = True,
    ) -> None:
        self.limits = SandboxLimits(timeout_s=timeout_s, total_timeout_s=total_timeout_s, memory_mb=memory_mb)
        self.isolate_tests = isolate_tests

    def __call__(self, response: str, reference: str) -> RewardResult:
        tests, entry_point, context = parse_reference(reference)
        code, how = extract_code(response, entry_point)
        if not code.strip():
            return RewardResult(0.0, False, {"status": "no_code", "extraction": how, "passed_fraction": 0.0})
        job = CodeJob(build_program(code, entry_point, context), tests, entry_point, context)
        verdict = run_job(job, self.limits, self.isolate_tests)
        info = {
            "status": verdict.status,
            "passed_fraction": verdict.passed_fraction,
            "tests_passed": sum(t.passed for t in verdict.tests),
            "tests": len(verdict.tests),
            "extraction": how,
            "detail": verdict.detail[:300],
            "network_isolated": verdict.network_isolated,
            "wall_seconds": verdict.wall_seconds,
        }
        return RewardResult(verdict.passed_fraction, verdict.passed, info)
