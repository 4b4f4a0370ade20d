"""The math verifier: extract the final answer, then compare it with the reference.

Extraction order: the last non-empty ``\\boxed{...}``; else the last "Answer: ..." line (also "final
answer is ..."); else the last number in the response.  Comparison: when the reference is a number,
the answer must be one number too — a single numeric literal, with words around it allowed ("3 red
squares") but no second number and no operator — so an unevaluated expression ("47 + 38", or the
operands side by side, which math-verify would add up) and a hedge ("5 or 7") earn nothing; otherwise
math-verify compares LaTeX, fractions, intervals and the like, and a final "Answer:" line that names
several different values is not rewarded.
"""

from __future__ import annotations

import re
from fractions import Fraction

from reasonrl.reward.base import RewardResult

# a numeric literal: thousands separators only in groups of three ("1,234"; "4,6" is two numbers)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
# the form the prompt template asks for: a line that starts with "Answer:" (a later "... this answer is
# correct." must not replace it)
TEMPLATE_ANSWER_LINE = re.compile(r"^[ \t]*(?:final answer|answer)[ \t]*:[ \t]*(.+)", re.IGNORECASE | re.MULTILINE)
BOXED = re.compile(r"\\boxed\s*\{")
# beside a number's one literal, these make the answer an expression ("\sqrt{16}", "2^", "3 - 4")
OPERATOR = re.compile(r"[-+*/^<>\\×÷·{}_|]")
LONGEST_LITERAL = 100  # characters; a longer "number" is no answer (and Fraction refuses > 4300 digits)


def answer_lines(text: str) -> list[str]:
    """The final-answer lines of a response, last one last: those in the template's "Answer: ..." form
    when there are any, else every "answer is ..." / "answer: ..." phrase."""
    return [m.group(1) for m in TEMPLATE_ANSWER_LINE.finditer(text)] or [m.group(1) for m in ANSWER_LINE.finditer(text)]


def last_boxed(text: str) -> str | None:
    """Content of the last non-empty ``\\boxed{...}`` (nested braces balanced), or None; one pass over
    the text, so unbalanced braces cost linear time."""
    closing, open_braces = {}, []
    for i, char in enumerate(text):
        if char == "{":
            open_braces.append(i)
        elif char == "}" and open_braces:
            closing[open_braces.pop()] = i
    for match in reversed(list(BOXED.finditer(text))):
        brace = match.end() - 1
        if brace in closing and (content := text[brace + 1 : closing[brace]].strip()):
            return content
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


def _unwrapped(text: str) -> str:
    """The answer without presentation: math delimiters, markdown emphasis, \\text{}, LaTeX spacing and
    currency, and a fraction of two integer literals as "a/b"."""
    text = re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}", r"\1/\2", text)
    for latex, plain in (("\\$", ""), ("\\%", "%"), ("\\!", ""), ("\\,", ""), ("\\(", ""), ("\\)", "")):
        text = text.replace(latex, plain)
    text = re.sub(r"\\(?:;|quad|qquad|:)", " ", text)
    return text.strip().strip("$*`_ ").rstrip(".").strip()


def _literal(text: str) -> Fraction | None:
    if len(text) > LONGEST_LITERAL:
        return None
    return Fraction(text.replace(",", ""))


def _as_number(text: str) -> Fraction | None:
    """``text`` as a number when it is one and nothing else: "1,234", "-7", "0.5", "3/4", "46%"."""
    cleaned = _unwrapped(text).removesuffix("%").strip()
    if NUMBER.fullmatch(cleaned):
        return _literal(cleaned)
    fraction = re.fullmatch(r"(-?\d+)/(\d+)", cleaned)
    if fraction and int(fraction.group(2)) != 0 and len(cleaned) <= LONGEST_LITERAL:
        return Fraction(int(fraction.group(1)), int(fraction.group(2)))
    return None


def numeric_answer(text: str) -> tuple[Fraction | None, str]:
    """(the number an answer states, '') or (None, why it states none): one numeric literal, words
    around it allowed, no second number and no operator."""
    number = _as_number(text)
    if number is not None:
        return number, ""
    cleaned = _unwrapped(text)
    literals = NUMBER.findall(cleaned)
    if not literals:
        return None, "no number in the answer"
    if len(literals) > 1:
        return None, "several numbers: an expression or several answers, not one number"
    if OPERATOR.search(cleaned.replace(literals[0], " ", 1)):
        return None, "an expression, not a number"
    number = _literal(literals[0])
    return number, "" if number is not None else "a number too long to be an answer"


def _distinct_numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def answers_match(candidate: str, reference: str) -> bool:
    """Whether two final answers are equal: as numbers when the reference is one (see
    ``numeric_answer``), else by math-verify."""
    expected = _as_number(reference)
    if expected is not None:
        return numeric_answer(candidate)[0] == expected
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
        if _as_number(reference) is not None:
            number, reason = numeric_answer(answer)
            if number is None:
                return RewardResult(0.0, False, {"extracted": answer, "reason": reason})
        elif how == "answer_line" and _as_number(answer) is None and len(_distinct_numbers(answer)) > 1:
            return RewardResult(0.0, False, {"extracted": answer, "reason": "several different answers"})
        correct = answers_match(answer, reference)
        return RewardResult(float(correct), correct, {"extracted": answer, "found_by": how})
