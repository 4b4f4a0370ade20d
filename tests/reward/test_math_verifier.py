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
    ("\\boxed{121}\\boxed{122}", "122", False, "several boxes with different values: two final answers"),
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
    # red-team findings: every final answer must be right, not only the one the grader picks
    ("\\boxed{1} \\boxed{2}", "2", False, "two boxes, two values: the first is a second final answer"),
    ("\\boxed{1} \\boxed{2}", "1", False, "two boxes, two values: the last is a second final answer"),
    ("\\boxed{12}\nAnswer: 13", "12", False, "a box and an 'Answer:' line that disagree"),
    ("Answer: 13\n\\boxed{12}", "12", False, "an 'Answer:' line and a box that disagree, the other order"),
    ("\\boxed{12}. Answer: 13", "12", False, "a capitalised 'Answer:' within the box's line is a final answer too"),
    ("Final Answer: $13$.\n\\boxed{12}", "12", False, "a 'Final Answer:' line is a final answer too"),
    ("\\boxed{\\sqrt{2}} \\boxed{\\sqrt{3}}", "\\sqrt{2}", False, "two LaTeX boxes that disagree"),
    ("\\boxed{12}\nAnswer: 12", "12", True, "a box and an 'Answer:' line that state the same value"),
    ("\\boxed{12} so \\boxed{12 \\text{ apples}}", "12", True, "two boxes with the same value in two forms"),
    ("Answer: \\boxed{12}", "12", True, "a box on the answer line is one answer, its content"),
    ("**Final Answer**\n\\boxed{12}", "12", True, "Qwen's closing heading then a box"),
    ("Final Answer: The final answer is $12$. I hope it is correct.", "12", True, "the Minerva answer form"),
    (
        "Final Answer: The final answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$. I hope it is correct.",
        "\\frac{\\sqrt3}{2}",
        True,
        "the Minerva form with a box and a LaTeX reference: framing words are read past, the box agrees",
    ),
    ("\\boxed{\\sqrt{2}}\nSo the answer is $\\sqrt{2}$.", "\\sqrt{2}", True, "a closing remark restates it"),
    ("I will write 'Answer: <answer>'.\nAnswer: 12", "12", True, "a quoted 'Answer:' (the prompt's) is no answer"),
    # red-team findings: a percent sign changes the value (0.5% = 0.005)
    ("\\boxed{0.5\\%}", "1/2", False, "0.5% is not one half"),
    ("\\boxed{0.5\\%}", "0.5", False, "0.5% is not 0.5: a percent on one side only is refused for a non-integer"),
    ("Answer: 0.5 percent", "\\frac{1}{2}", False, "the word 'percent' is a percent sign"),
    ("Answer: 50%", "1/2", False, "a percent is not read as a proportion: 50% against 1/2 is refused (safe side)"),
    ("\\boxed{0.5\\%}", "0.5\\%", True, "a percent against a percent reference"),
    ("Answer: 25%", "25", True, "GSM8K: a whole-number percent question's reference is the plain number"),
    ("Answer: 25", "25\\%", True, "GSM8K: and the plain whole number against a percent reference"),
    # red-team findings: a decimal approximation is not an exact value (math-verify rounds to 6 places)
    ("\\boxed{1.4142136}", "\\sqrt{2}", False, "7 decimals of sqrt(2) are not sqrt(2)"),
    ("\\boxed{3.1415927}", "\\pi", False, "7 decimals of pi are not pi"),
    ("\\boxed{0.5\\sqrt{3}}", "\\frac{\\sqrt{3}}{2}", True, "an exact decimal in an exact expression is exact"),
    ("\\boxed{(0.5, 1)}", "\\left(\\frac{1}{2}, 1\\right)", True, "exact decimals in an interval"),
    # the allow-list's cost, on purpose: an unknown word beside the value is refused, not read past
    ("Answer: 12 gizmos", "12", False, "a word that is in no allow-list is refused, even a harmless noun"),
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
    # an allow-list, not a deny-list: any word that is not known to be harmless makes it no answer
    "a word beside the value that negates, bounds or hedges it, in any language": [
        (answer, "12")
        for answer in ("12 is wrong", "12 is incorrect", "12 is false", "cannot be 12", "can't be 12", "nicht 12",
                       "au moins 12", "au plus 12", "pas 12", "jamais 12", "no es 12", "mindestens 12",
                       "impossible to be 12", "doubt it's 12", "definitely not 12", "maybe 12", "perhaps 12",
                       "probably 12", "likely 12", "12 maybe", "12 probably", "12? no", "12. No", "is it 12", "12 nope",
                       "12 wrong", "unlikely 12", "12 peut-\u00eatre", "\u043d\u0435 12", "\u4e0d\u662f12",
                       "could be 12", "not quite 12", "12 or so",
                       "12 (wrong)", "12 if rounded", "rounded 12", "over 12", "min 12", "square of 12", "12 = wrong",
                       "12 \\text{ is wrong}", "\\textbf{not} 12", "\\mathrm{nicht}\\ 12", "\\operatorname{approx} 12",
                       "12 \\mbox{at most}", "\\textit{about} 12", "3 \\mathbf{ or } 12", "12 \\mathbf{ or more}")
    ],
    "a percent is not the plain value it is a hundredth of": [
        (answer, reference)
        for answer in ("0.5\\%", "0.5%", "0.5 %", "0.5 percent", "0.5 per cent", "\\frac{1}{2}\\%")
        for reference in ("1/2", "0.5", "\\frac{1}{2}")
    ],
    "a decimal approximation is not an exact value": [
        ("1.4142136", "\\sqrt{2}"), ("1.41421356", "\\sqrt{2}"), ("1.414213562373095048801688724", "\\sqrt{2}"),
        ("3.1415927", "\\pi"), ("3.14159265358979", "\\pi"), ("2.7182818", "e"), ("1.5707963", "\\frac{\\pi}{2}"),
        ("0.7071068", "\\frac{\\sqrt{2}}{2}"), ("\\pi + 1.4142135623730950488", "\\pi + \\sqrt{2}"),
        ("\\frac{14142136}{10000000}", "\\sqrt{2}"), ("\\sqrt{2.0000001}", "\\sqrt{2}"),
        ("(0.4999999, 1)", "(0.5, 1)"), ("0.3333333", "\\frac{x}{3x}"), ("\\sqrt{2}^{1.0000001}", "\\sqrt{2}"),
    ],
    "a LaTeX relation, text command or symbol the reference does not use": [
        (answer, "\\sqrt{2}")
        for answer in ("\\sqrt{2} \\approxeq 1.41", "\\approxeq \\sqrt{2}", "\\simeq \\sqrt{2}", "\\sim \\sqrt{2}",
                       "\\lesssim \\sqrt{2}", "\\gtrsim \\sqrt{2}", "x \\le \\sqrt{2}", "x \\geq \\sqrt{2}",
                       "x \\ne \\sqrt{3}", "x \\not= \\sqrt{3}", "\\cong \\sqrt{2}",
                       "\\sqrt{2} \\mathbf{ or } \\sqrt{3}",
                       "\\sqrt{2} \\textbf{ is wrong}", "\\operatorname{not} \\sqrt{2}", "\\mbox{at least } \\sqrt{2}",
                       "\\sqrt{2} \\mathrm{ nicht}", "\\sqrt{2} \\textit{ ish}", "\\sqrt{2} is wrong", "\\sqrt{2}?",
                       "\\sqrt{2}\\%", "\\sqrt{2} \\pm 1", "\\sqrt{2} \\text{ is } \\sqrt{3}",
                       "\\pi \\text{ m} \\sqrt{3}",
                       "\u4e0d \\sqrt{2}", "\\sqrt{2}\u200b", "\\lim \\sqrt{2}", "\\overline{\\sqrt{2}}")
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


# What real models write for a right answer must stay right: each row says which form it is.
RIGHT_RESPONSES = [
    ("The answer is 12.", "12", "a plain closing sentence"),
    ("Answer: $12", "12", "a dollar sign (currency or an unclosed math delimiter)"),
    ("Answer: \\$18.00", "18", "escaped currency and cents"),
    ("\\boxed{12}", "12", "a box"),
    ("Answer: **12**", "12", "markdown bold"),
    ("Answer: The answer is **12**.", "12", "framing words and bold inside the answer line"),
    ("Answer: x = 12", "12", "a variable named"),
    ("Answer: n = 12", "12", "another variable"),
    ("Answer: It is 12.", "12", "framing words"),
    ("Answer: There are 3 red squares.", "3", "a counting task's colour and shape"),
    ("Answer: a total of 12 cookies", "12", "'a total of' and a counted thing"),
    ("Answer: She has 12 apples left.", "12", "a subject, a verb and 'left'"),
    ("Answer: 12 apples", "12", "a counted thing"),
    ("Answer: 12 cm", "12", "a unit"),
    ("Answer: 12 m^2", "12", "a unit's exponent"),
    ("Answer: 12 cm\u00b2", "12", "a unit's superscript exponent"),
    ("Answer: 12 km/h", "12", "a unit per unit"),
    ("Answer: 12 square feet", "12", "an area unit"),
    ("Answer: 12 years old", "12", "an age"),
    ("Answer: 12 in total", "12", "'in total'"),
    ("Answer: The area is \\boxed{12} square units.", "12", "a quantity named, a box inside the answer line, a unit"),
    ("\\boxed{12 \\text{ apples}}", "12", "a unit in \\text{}"),
    ("\\boxed{12\\,\\text{cm}^2}", "12", "a LaTeX unit with spacing and exponent"),
    ("\\boxed{30^\\circ}", "30", "degrees in LaTeX"),
    ("\\boxed{1{,}000}", "1000", "a LaTeX thousands separator"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}", "a LaTeX value"),
    ("\\boxed{1.5x}", "\\frac{3}{2}x", "an exact decimal coefficient"),
    ("\\boxed{1.25}", "\\frac{5}{4}", "an exact decimal for a fraction"),
    ("\\boxed{3 \\text{ and } 5}", "3, 5", "a list joined by 'and'"),
    ("\\boxed{x \\in [1, 2)}", "[1, 2)", "membership in the reference's interval"),
    ("\\boxed{\\theta = \\sqrt{2}}", "\\sqrt{2}", "a Greek variable named"),
    ("Answer: \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", "a LaTeX answer line with several numbers in it"),
    ("The answer is $\\left(3, \\frac{\\pi}{2}\\right)$.", "\\left( 3, \\frac{\\pi}{2} \\right)", "a framed tuple"),
    ("Let me verify the answer: 5 + 7 = 12.\n\\boxed{12}", "12", "a lower-case 'answer:' remark is no final answer"),
]


@pytest.mark.parametrize(("response", "reference", "form"), RIGHT_RESPONSES, ids=[r[2] for r in RIGHT_RESPONSES])
def test_a_right_answer_in_a_real_models_form_stays_right(response, reference, form):
    result = MathVerifier()(response, reference)
    assert result.correct, (form, result.info)


def test_a_refusal_names_the_word_it_does_not_know():
    info = MathVerifier()("Answer: 12 is wrong", "12").info
    assert info["reason"] == "a word beside the number that is not known to leave it unchanged: 'wrong'"
    assert "disagree" in MathVerifier()("\\boxed{1} \\boxed{2}", "2").info["reason"]


def test_many_different_final_answers_are_no_answer():
    response = "".join(f"\\boxed{{{i}}}" for i in range(20)) + "\\boxed{12}"
    assert MathVerifier()(response, "12").info["reason"] == "too many final answers"


def test_deeply_nested_boxes_are_read_in_linear_time():
    assert MathVerifier()("\\boxed{" * 20_000 + "7" + "}" * 20_000, "7").correct
