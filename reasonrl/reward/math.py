"""The math verifier: extract the final answer, then compare it with the reference.

Extraction order: the last ``\\boxed{...}``; else the last "Answer: ..." line (also "final answer
is ..."); else the last number in the response.  A final answer that names several different
values ("5 or 7") is not rewarded: hedging must not pay.  Comparison: exact numbers first (fast,
no sympy), then math-verify for LaTeX, fractions, intervals and the like.
"""

from __future__ import annotations

import re
from fractions import Fraction

from reasonrl.reward.base import RewardResult

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
# the form the prompt template asks for: a line that starts with "Answer:" (a later "... this answer is
# correct." must not replace it)
TEMPLATE_ANSWER_LINE = re.compile(r"^[ \t]*(?:final answer|answer)[ \t]*:[ \t]*(.+)", re.IGNORECASE | re.MULTILINE)


def answer_lines(text: str) -> list[str]:
    """The final-answer lines of a response, last one last: those in the template's "Answer: ..." form
    when there are any, else every "answer is ..." / "answer: ..." phrase."""
    return [m.group(1) for m in TEMPLATE_ANSWER_LINE.finditer(text)] or [m.group(1) for m in ANSWER_LINE.finditer(text)]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = text.find("{", start)
        if brace != -1 and text[start + len("\\boxed") : brace].strip() == "":
            depth = 0
            for i in range(brace, len(text)):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return text[brace + 1 : i].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer text, how it was found): 'boxed', 'answer_line', 'last_number' or 'none'."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    lines = answer_lines(text)
    if lines:
        return lines[-1].strip().rstrip(".").strip(), "answer_line"
    numbers = NUMBER.findall(text)
    if numbers:
        return numbers[-1], "last_number"
    return None, "none"


def _as_number(text: str) -> Fraction | None:
    cleaned = text.strip().strip("$").replace(",", "").replace("\\!", "").strip()
    cleaned = cleaned.removesuffix("\\%").removesuffix("%").strip()
    match = re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+|-?\d+/\d+", cleaned)
    if not match:
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _distinct_numbers(text: str) -> set[Fraction]:
    return {Fraction(n.replace(",", "")) for n in NUMBER.findall(text)}


def answers_match(candidate: str, reference: str) -> bool:
    """Whether two final answers are equal: exactly as numbers, else by math-verify."""
    a, b = _as_number(candidate), _as_number(reference)
    if a is not None and b is not None:
        return a == b
    from math_verify import parse, verify

    gold = parse(f"${reference}$") or parse(reference)
    prediction = parse(f"${candidate}$") or parse(candidate)
    return bool(gold and prediction and verify(gold, prediction))


class MathVerifier:
    """Correct if the extracted final answer equals the reference; score 1.0 or 0.0."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        answer, how = extract_answer(response)
        if answer is None:
            return RewardResult(0.0, False, {"extracted": None, "reason": "no answer found"})
        if how == "answer_line" and _as_number(answer) is None and len(_distinct_numbers(answer)) > 1:
            return RewardResult(0.0, False, {"extracted": answer, "reason": "several different answers"})
        correct = answers_match(answer, reference)
        return RewardResult(float(correct), correct, {"extracted": answer, "found_by": how})
