"""The math verifier, as a table: each row says what it checks."""

import pytest

from reasonrl.reward.format import FormatVerifier
from reasonrl.reward.math import MathVerifier, extract_answer, last_boxed

CASES = [
    # (response, reference, correct, reason)
    ("The sum is \\boxed{122}.", "122", True, "boxed answer"),
    ("59 + 63 = 122", "122", True, "plain number: the last number is the answer"),
    ("First 50, then 72.\nAnswer: 122", "122", True, "an 'Answer:' line wins over other numbers"),
    ("Answer: 122.", "122", True, "trailing period after the answer"),
    ("The final answer is 1,234", "1234", True, "thousands separator"),
    ("Answer: -7", "-7", True, "negative number"),
    ("\\boxed{\\frac{1}{2}}", "0.5", True, "fraction equals decimal"),
    ("\\boxed{0.5}", "\\frac{1}{2}", True, "decimal equals LaTeX fraction"),
    ("Answer: 3/4", "0.75", True, "slash fraction"),
    (
        "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        True,
        "LaTeX tuple via math-verify",
    ),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True, "symbolic equivalence via math-verify"),
    ("Answer: 033", "33", True, "zero-padded AIME answers compare as numbers"),
    ("59 + 63 = 121", "122", False, "wrong number"),
    ("\\boxed{121} but maybe 122", "122", False, "the boxed answer counts, not a later number"),
    ("Answer: 121 or 122", "122", False, "several different answers: hedging is not rewarded"),
    ("\\boxed{121}\\boxed{122}", "122", True, "several boxes: the last one is the final answer"),
    ("", "122", False, "empty response"),
    ("I don't know.", "122", False, "no answer at all"),
    ("Answer: 12.2", "122", False, "decimal point matters"),
    ("Answer: 122\nI am sure this answer is correct.", "122", True, "a remark after the answer line changes nothing"),
    ("The answer is 121.\nAnswer: 122", "122", True, "the template's line wins over an earlier phrase"),
    ("Answer: 122\nWait, the answer: 121", "122", True, "only lines that start with 'Answer:' are the template's"),
    # red-team findings: an answer must be the number, not an expression that evaluates to it
    ("\\boxed{47 + 38}", "85", False, "an unevaluated sum (the question's operands copied) is not the answer"),
    ("\\boxed{47 38}", "85", False, "operands side by side (math-verify would add them) are not the answer"),
    ("\\boxed{47\\;38}", "85", False, "operands apart by LaTeX spacing are two numbers"),
    ("\\boxed{93-38}", "55", False, "an unevaluated difference is not the answer"),
    ("\\boxed{47 \\times 38}", "1786", False, "an unevaluated product is not the answer"),
    ("Answer: 44+44", "88", False, "an expression of equal operands is not the answer either"),
    ("\\boxed{\\sqrt{7225}}", "85", False, "one literal under an operator is an expression"),
    ("Answer: 4,6", "46", False, "a comma between single digits separates two numbers, not thousands"),
    ("Answer: " + "1" * 5000, "1", False, "a 5000-digit literal is refused, not a crash"),
    ("Answer: 3 red squares", "3", True, "words around the one number (a counting answer)"),
    ("There are 2 blue circles.", "2", True, "the last number when there is no answer line"),
    ("Answer: **46**", "46", True, "markdown emphasis around the answer"),
    ("Answer: `46`", "46", True, "inline code around the answer"),
    ("Answer: $\\text{46 apples}$", "46", True, "LaTeX text with a unit"),
    ("Put it in \\boxed{}.\nAnswer: 46", "46", True, "an empty box is not an answer"),
    ("Answer: x = 4", "4", True, "a variable named beside the one number"),
]


@pytest.mark.parametrize(("response", "reference", "correct", "reason"), CASES, ids=[c[3] for c in CASES])
def test_math_verifier_table(response, reference, correct, reason):
    result = MathVerifier()(response, reference)
    assert result.correct is correct, reason
    assert result.score == (1.0 if correct else 0.0)


def test_verdict_info_says_what_was_extracted():
    result = MathVerifier()("so\nAnswer: 42", "42")
    assert result.info == {"extracted": "42", "found_by": "answer_line"}
    assert MathVerifier()("nothing", "1").info["reason"] == "no answer found"


def test_extraction_order_and_nested_boxes():
    assert last_boxed("\\boxed{\\frac{a}{b}} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None
    assert extract_answer("5 then 6") == ("6", "last_number")
    assert extract_answer("The answer is 7, not 6") == ("7, not 6", "answer_line")


def test_format_reward():
    assert FormatVerifier()("Answer: 5", "").score == 1.0
    assert FormatVerifier()("\\boxed{5}", "").score == 1.0
    assert FormatVerifier()("it is 5", "").score == 0.0


def test_unbalanced_boxes_are_read_in_one_pass():
    assert last_boxed("\\boxed{" * 20_000) is None
    assert last_boxed("\\boxed{" * 20_000 + "\\boxed{7}") == "7"
    assert last_boxed("\\boxed{5} \\boxed{ }") == "5"
