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
    # red-team findings: the whole stated value must equal the reference, not one number picked out of it
    ("Answer: \u221212", "12", False, "a minus written as U+2212 is a minus: -12 is not 12"),
    ("\\boxed{\u201312}", "12", False, "an en dash before the number is a minus sign too"),
    ("Answer: \u22127", "-7", True, "a unicode minus equals the ASCII one"),
    ("Answer: \u2260 12", "12", False, "a relation is not the value"),
    ("Answer: \u2265 12", "12", False, "a bound is not the value"),
    ("Answer: not 12", "12", False, "a negation is not the value"),
    ("Answer: at least 12", "12", False, "a bound in words is not the value"),
    ("Answer: about 12", "12", False, "an approximation (about, \\approx) is not the value"),
    ("Answer: 12\u00b2", "12", False, "a superscript makes the number an expression"),
    ("Answer: 12!", "12", False, "a factorial makes the number an expression"),
    ("Answer: \u221a144", "144", False, "a unicode root makes the number an expression"),
    ("Answer: 12\u00b1", "12", False, "a plus-minus sign hedges the value"),
    ("Answer: twelve or 13", "13", False, "a number word is a second number: hedging is not rewarded"),
    ("Answer: 12, 13", "12", False, "a list of numbers is not one number"),
    ("Answer: 12k", "12", False, "a letter glued to the number scales it (or is a variable, or i)"),
    ("Answer: 12/1", "12", True, "a fraction equal to the number states the number"),
    ("Answer: 12 cm", "12", True, "a unit word after the number"),
    ("Answer: 12 more apples", "12", True, "a count of 'more' things is no bound ('more than 12' is)"),
    ("\\boxed{\\sqrt3=\\sqrt2}", "\\sqrt2", False, "a false equation is not graded by its right side"),
    ("\\boxed{\\sqrt{2} = x}", "\\sqrt{2}", True, "an equation is graded by every side but a bare name"),
    ("\\boxed{\\sqrt{2} \\approx 1.41}", "\\sqrt{2}", False, "a relation math-verify reads past is refused"),
    ("\\boxed{\\sqrt{2}'}", "\\sqrt{2}", False, "a prime math-verify reads past is refused"),
    ("\\boxed{12}", "12 \\text{ m}, 5 \\text{ s}", False, "a reference with units: its second value counts too"),
    ("\\boxed{12 \\text{ m}, 5 \\text{ s}}", "12 \\text{ m}, 5 \\text{ s}", True, "the whole list with units is right"),
    ("\\boxed{\\sqrt{2} \\text{ m}, 5 \\text{ m}}", "\\sqrt{2}", False, "an answer's value after a unit counts too"),
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


# Each class of a wrong answer that still names the reference's value somewhere, in many variants: none may
# grade correct, in a box, on an "Answer:" line or in a "final answer is" phrase.
WRONG_BY_CLASS = {
    "a unicode minus or dash is a minus sign": [
        (form.format(dash), "12")
        for dash in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d"
        for form in ("{}12", "{} 12", "x = {}12", "{}\\frac{{24}}{{2}}")
    ],
    "a relation is not the value": [
        (form.format(relation), "12")
        for relation in ("≠", "≥", "≤", ">", "<", "≈", "~", "∼", "≃", "≅", "!=", "=/=", "\\neq", "\\geq",
                         "\\approx", "\\sim")
        for form in ("{}12", "{} 12", "x {} 12")
    ],
    "a word that negates, bounds or hedges is not the value": [
        (f"{phrase} 12", "12")
        for phrase in ("not", "is not", "isn't", "never", "anything but", "at least", "at most", "more than",
                       "less than", "no fewer than", "over", "under", "above", "below", "up to", "approximately",
                       "about", "around", "roughly", "nearly", "almost", "negative", "minus", "Not", "NOT", "ABOUT")
    ] + [
        (f"12 {phrase}", "12")
        for phrase in ("or more", "or less", "or so", "at most", "at least", "and up", "and above", "and more",
                       "plus", "squared", "cubed", "thousand", "million", "dozen", "max", "minimum", "or twelve", "ish")
    ],
    "a unicode operator makes an expression": [(f"12{mark}", "12") for mark in "²³¹⁰!‼±∓′″ⁿˣ⁺⁻½∞π·×"]
    + [(f"{mark}12", "12") for mark in "√∛∜±∓∑∏∠¬≈⁻%°"]
    + [(f"{mark}144", "12") for mark in "√∛"],
    "a number word or second number is a hedge": [
        (form.format(word), "13")
        for word in ("twelve", "fourteen", "a dozen", "one", "half", "ten", "thirteen", "XIII", "Twelve")
        for form in ("{} or 13", "13 or {}", "13, {}", "{} (13)", "13 ({})")
    ] + [(answer, "13") for answer in ("12 or 13", "13, 12", "13; 14", "13 and 14", "13 \\pm 1", "13 to 14")],
    "a letter beside the number scales it or is a variable": [
        (answer, "12")
        for answer in ("12k", "12K", "12M", "12i", "12j", "12e", "12x", "12n", "x12", "12pi", "12 i", "e 12")
    ],
    "an equation is right only when every side is": [
        (answer, "\\sqrt{2}")
        for answer in ("\\sqrt3=\\sqrt2", "\\sqrt{3} = \\sqrt{2}", "1 = \\sqrt{2}", "\\pi = \\sqrt{2}",
                       "\\sqrt{2} = \\sqrt{3}", "x = \\sqrt{3} = \\sqrt{2}", "2x = \\sqrt{2}", "x = y")
    ],
    "a relation, separator or mark that math-verify reads past": [
        (answer, "\\sqrt{2}")
        for answer in ("\\sqrt{2} \\approx 1.41", "\\sqrt{2} \\neq 1", "1.41 \\approx \\sqrt{2}", "\\sqrt{2} ≈ 1.41",
                       "≠ \\sqrt{2}", "=/= \\sqrt{2}", "\\sqrt{2}'", "5 & \\sqrt{2}", "5 \\\\ \\sqrt{2}",
                       "5 | \\sqrt{2}", "5 \\mid \\sqrt{2}", "5 \\vee \\sqrt{2}", "\\sqrt{3} $ \\sqrt{2}",
                       "\\sqrt{2} $ \\sqrt{3}", "\\sqrt{2} \\text{; } \\sqrt{3}", "\\text{not } \\sqrt{2}",
                       "\\sqrt{2} \\text{ thousand}", "\u2212\\sqrt{2}", "\\sqrt{2} \\text{ or } \\sqrt{3}")
    ] + [
        (answer, "5 \\text{ cm}^2")  # math-verify reads the plain 5 out of these
        for answer in ("\\sqrt{2} & 5", "7 \\\\ 5", "\\sqrt{3} | 5", "5 \\approx 4.9", "5 \\text{ or } 6")
    ],
    "every value of a list with units counts": [
        ("12", "12 \\text{ m}, 5 \\text{ s}"),
        ("5", "12 \\text{ m}, 5 \\text{ s}"),
        ("12", "12\\,\\text{m}, 7\\,\\text{m}"),
        ("12", "12 \\text{ cm and } 5 \\text{ cm}"),
        ("12", "12\\text{ m}^2, 5\\text{ m}^2"),
        ("12", "12 \\text{ cm by } 5 \\text{ cm}"),
        ("60", "12 \\text{ cm by } 5 \\text{ cm}"),
        ("\\sqrt{2} \\text{ m}, 5 \\text{ m}", "\\sqrt{2}"),
        ("\\sqrt{2} \\text{ cm and } 3 \\text{ cm}", "\\sqrt{2}"),
    ],
}  # fmt: skip
WRAPPERS = ("\\boxed{%s}", "Answer: %s", "The final answer is %s.")


@pytest.mark.parametrize("wrong_class", WRONG_BY_CLASS)
def test_no_variant_of_a_wrong_answer_class_grades_correct(wrong_class):
    verifier = MathVerifier()
    graded_correct = [
        (wrapper % answer, reference)
        for answer, reference in WRONG_BY_CLASS[wrong_class]
        for wrapper in WRAPPERS
        if verifier(wrapper % answer, reference).correct
    ]
    assert graded_correct == [], wrong_class


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("85", "85"), ("\u221212", "-12"), ("\u201312", "-12"), ("x = 12", "12"), ("12 apples", "12"), ("12.0", "12"),
        ("1,000", "1000"), ("\\frac{1}{2}", "0.5"), ("12/1", "12"), ("$12", "12"), ("12%", "12"), ("12 cm", "12"),
        ("12m", "12"), ("12 left over", "12"), ("12 more", "12"), ("x = \\sqrt{2}", "\\sqrt{2}"),
        ("\\sqrt{2} = x", "\\sqrt{2}"), ("f(x) = \\sqrt{2}", "\\sqrt{2}"), ("\\frac{2}{\\sqrt{2}}", "\\sqrt{2}"),
        ("\\sqrt{2} \\text{ m}", "\\sqrt{2}"), ("\u2212\\sqrt{2}", "-\\sqrt{2}"),
    ],
)  # fmt: skip
def test_the_whole_value_stated_in_any_form_grades_correct(answer, reference):
    verifier = MathVerifier()
    assert [wrapper % answer for wrapper in WRAPPERS if not verifier(wrapper % answer, reference).correct] == []
