"""The math verifier: a response is right only when every final answer it states is the reference's value.

Final answers: every non-empty ``\\boxed{...}`` (the outermost of nested ones), every line that starts with
"Answer:" or "Final answer:" (markdown around it allowed) and every capitalised "Answer:" within a line
("\\boxed{12}. Answer: 13"; a lower-case "the answer: 13" in the reasoning is a remark).  They must all be
right, so two different values (``\\boxed{1} \\boxed{2}``, or a box and an "Answer:" line that disagree,
in either order) earn nothing, while several that state the same value are fine; more than
``MOST_FINAL_ANSWERS`` different ones are no answer.  Only when there is none, the last "answer is ..." /
"answer: ..." phrase is the answer, else the last number.  A box inside an answer line counts as its
content; the Minerva form "Final Answer: The final answer is $12$. I hope it is correct." reads as 12.
Every dash a minus sign is written with (U+2212, the en dash, the fullwidth hyphen-minus, ...) reads as "-"
first, so "−12" is minus twelve.

Comparison of one answer: the whole stated value counts, and what stands beside it must be known to be
harmless, an allow-list rather than a list of bad words (``math_answer.py``).  When the reference is a
number the answer must be one numeric literal, with only framing words ("The answer is", "so", "x ="),
units and counted things ("12 cm", "3 red squares", "12 more apples") beside it: any other word, in any
language ("12 is wrong", "nicht 12", "au moins 12"), any operator, relation or mark ("47 + 38", "≥ 12",
"12? no", "12²"), a second number or a letter that is no unit ("12k", "e 12") make it no answer.  A percent
sign on one side only counts for whole numbers ("25%" against the GSM8K reference "25"); "0.5%" is not
"0.5" or "1/2".  Otherwise math-verify compares LaTeX, fractions, intervals and the like, on the whole
answer, after these rules: the answer may use a LaTeX command, mark or word outside the safe ones
(``\\approx``, ``\\approxeq``, ``\\le``, ``\\sim``, ``\\cong``, "≠", "&", a prime, ``\\text{ or }``,
``\\mathbf{ is wrong }``) only where the reference uses it too; decimals are read as exact fractions and
compared to 850 digits, so no decimal approximation (1.4142136, 3.1415927) equals an exact reference
(``\\sqrt{2}``, ``\\pi``); unit words after a value are dropped first (math-verify stops reading at the
first unit, which would leave a list's later values unread); and an equation is right only when every
side but a bare name equals the reference (``\\sqrt3=\\sqrt2`` is wrong against ``\\sqrt2``).
"""

from __future__ import annotations

import re

from reasonrl.reward.math_answer import (
    ANSWER_WORDS,
    NUMBER,
    TEXT_COMMAND,
    UNIT_LETTERS,
    WORD,
    WORD_CHARS,
    is_unit_word,
    numbers_equal,
    numeric_answer,
    reference_number,
    unsupported_by_reference,
    without_framing_words,
)
from reasonrl.reward.verifier_protocol import RewardResult

ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
# the form the prompt template asks for: a line that starts with "Answer:" (a later "... this answer is
# correct." must not replace it)
TEMPLATE_ANSWER_LINE = re.compile(r"^[ \t]*(?:final answer|answer)[ \t]*:[ \t]*(.+)", re.IGNORECASE | re.MULTILINE)
# a final answer: a line in the template's form, also in markdown ("**Final Answer:** 12", "## answer: 12"),
# or the template's capitalised "Answer:" within a line ("\boxed{12}. Answer: 13"; "the answer: 13" is a remark)
FINAL_ANSWER_LINE = re.compile(
    r"(?:^[ \t>#*_]*(?i:final[ \t]+answer|answer)|(?<![A-Za-z][ \t])(?<![A-Za-z'\"‘“`{])(?:Final [Aa]nswer|Answer))"
    r"[ \t*_]*:[ \t*_]*(\S.*)",
    re.MULTILINE,
)
MINERVA_TRAILER = re.compile(r"(?<![.\s])[.\s]*I hope it is correct[.\s]*$", re.IGNORECASE)
BOXED = re.compile(r"\\boxed\s*\{")
MOST_FINAL_ANSWERS = 10  # distinct final answers graded; more is no answer (and bounds the work)
# every dash a minus sign is written with: hyphen, non-breaking hyphen, figure, en and em dash, horizontal
# bar, hyphen bullet, minus sign, modifier and heavy minus, two- and three-em dash, small and fullwidth
# hyphen-minus
DASHES = re.compile("[\u2010-\u2015\u2043\u2212\u02d7\u2796\u2e3a\u2e3b\ufe58\ufe63\uff0d]")
MATH_DELIMITER = re.compile(r"\\?\$|\\[()\[\]]")  # "$", "\$", "\(", "\[": they carry no value
LATEX_TEXT = re.compile(rf"({TEXT_COMMAND})\s*\{{([^{{}}]*)\}}")  # (command, words)
# one-word \text{}s after a value or a name, with LaTeX spacing and a unit's exponent: "12\,\text{m}^2",
# "5 \text{cm}", "\pi \text{ m}" (math-verify stops reading at a \text{} that follows a value)
UNITS_AFTER_VALUE = re.compile(
    rf"(?P<value>[\w}})\]])(?P<units>(?:(?:\s|\\[,;:! ]|\\q?quad)*{TEXT_COMMAND}\s*\{{[{WORD_CHARS}]+\}}"
    r"(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?)+)"
)
KEPT_AFTER_VALUE = frozenset({"and", "e", "i"})  # a list's "and"; "2\mathrm{i}" is a value, not 2 of a unit
DECIMAL = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")
EXACT_DIGITS = 850  # math-verify's numeric precision: a 100-digit approximation differs well above it


def answer_lines(text: str) -> list[str]:
    """The final-answer lines of a response, last one last: those in the template's "Answer: ..." form
    when there are any, else every "answer is ..." / "answer: ..." phrase."""
    return [m.group(1) for m in TEMPLATE_ANSWER_LINE.finditer(text)] or [m.group(1) for m in ANSWER_LINE.finditer(text)]


def _closing_braces(text: str) -> dict[int, int]:
    """Each balanced "{" position's "}" position; one pass, so unbalanced braces cost linear time."""
    closing, open_braces = {}, []
    for i, char in enumerate(text):
        if char == "{":
            open_braces.append(i)
        elif char == "}" and open_braces:
            closing[open_braces.pop()] = i
    return closing


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` not inside another one (nested braces balanced), in order;
    linear time, however deep the boxes nest."""
    closing = _closing_braces(text)
    contents, end = [], -1
    for match in BOXED.finditer(text):
        brace = match.end() - 1
        if brace > end and brace in closing:
            end = closing[brace]
            contents.append(text[brace + 1 : end])
    return contents


def last_boxed(text: str) -> str | None:
    """Content of the last non-empty ``\\boxed{...}`` (the innermost of nested ones), or None."""
    closing = _closing_braces(text)
    for match in reversed(list(BOXED.finditer(text))):
        brace = match.end() - 1
        if brace in closing and (content := text[brace + 1 : closing[brace]].strip()):
            return content
    return None


def _without_boxes(text: str) -> str:
    """``text`` with every ``\\boxed{X}`` read as X (an answer line "Answer: \\boxed{12}" states 12)."""
    closing = _closing_braces(text)
    boxes = [(m.start(), m.end() - 1) for m in BOXED.finditer(text) if m.end() - 1 in closing]
    drop = {i for start, brace in boxes for i in (*range(start, brace + 1), closing[brace])}
    return "".join(char for i, char in enumerate(text) if i not in drop)


def _statement(text: str) -> str:
    """An answer as it is stated: boxes read as their content, without the Minerva form's "I hope it is
    correct." and a closing full stop."""
    return MINERVA_TRAILER.sub("", _without_boxes(text)).strip().rstrip(".").strip()


def final_answers(text: str) -> tuple[list[str], str]:
    """(every final answer a response states, the main one last: its last box, else its last answer line;
    how the main one was found: 'boxed', 'answer_line', 'last_number' or 'none')."""
    lines = [answer for m in FINAL_ANSWER_LINE.finditer(text) if (answer := _statement(m.group(1)))]
    boxes = [answer for content in boxed_contents(text) if (answer := _statement(content))]
    if lines or boxes:
        return lines + boxes, "boxed" if boxes else "answer_line"
    if phrases := [m.group(1) for m in ANSWER_LINE.finditer(text)]:
        return [_statement(phrases[-1])], "answer_line"
    if numbers := NUMBER.findall(text):
        return [numbers[-1]], "last_number"
    return [], "none"


def extract_answer(text: str) -> tuple[str | None, str]:
    """(the main final answer, how it was found): 'boxed', 'answer_line', 'last_number' or 'none'."""
    answers, how = final_answers(text)
    return (answers[-1] if answers else None), how


def _ascii_minus(text: str) -> str:
    """``text`` with every dash a minus sign is written with as "-"."""
    return DASHES.sub("-", text)


def _without_units(match: re.Match) -> str:
    """A value and the \\text{} words after it, less its unit and framing words (words the reference uses,
    "and", "e" and "i" stay); dropped words between two values ("12 \\text{ cm by } 5") leave a comma, not
    a product."""
    kept = [
        text.group()
        for text in LATEX_TEXT.finditer(match["units"])
        if text[2].lower() in KEPT_AFTER_VALUE
        or not (is_unit_word(text[2]) or text[2] in UNIT_LETTERS or text[2].lower() in ANSWER_WORDS)
    ]
    separator = "," if not kept and re.match(r"\s*-?\d", match.string[match.end() :]) else ""
    return " ".join([match["value"], *kept, separator])


def _plain_latex(latex: str) -> str:
    """The LaTeX math-verify reads, made to read all of it: dashes as "-", no math delimiters (a "$" inside
    would end its reading), one word per \\text{} with punctuation outside it (math-verify stops at a
    "\\text{; }"), and no unit words after a value (it stops at "12 \\text{ m}, 5 \\text{ s}" after the 12)."""
    latex = MATH_DELIMITER.sub(" ", _ascii_minus(latex))
    latex = LATEX_TEXT.sub(lambda text: WORD.sub(lambda word: f"{text[1]}{{{word[0]}}}", text[2]), latex)
    return UNITS_AFTER_VALUE.sub(_without_units, latex)


def _equation_sides(expression) -> list | None:
    """The sides of an equation or a chain of them ("x = a = b"), or None for anything else."""
    from sympy import And, Eq

    relations = expression.args if isinstance(expression, And) else (expression,)
    if not all(isinstance(relation, Eq) for relation in relations):
        return None
    return [side for relation in relations for side in (relation.lhs, relation.rhs)]


def _latex_match(candidate: str, reference: str) -> bool:
    """math-verify on the whole answer: an equation is right when every side but a bare name ("x",
    "f(x)") equals a reference that is no relation itself."""
    from math_verify import parse, verify
    from sympy import And, Basic, Symbol
    from sympy.core.function import AppliedUndef
    from sympy.core.relational import Relational

    gold = parse(f"${_plain_latex(reference)}$") or parse(reference)
    prediction = parse(f"${_plain_latex(candidate)}$")
    if not (gold and prediction):
        return False
    sides = _equation_sides(prediction[0]) if isinstance(prediction[0], Basic) else None
    if sides is None or any(isinstance(value, Relational | And) for value in gold):
        return verify(gold, prediction, numeric_precision=EXACT_DIGITS)
    values = [side for side in sides if not isinstance(side, Symbol | AppliedUndef)]
    return bool(values) and all(verify(gold, value, numeric_precision=EXACT_DIGITS) for value in values)


def _exact_decimals(latex: str) -> str:
    """``latex`` with each decimal as the fraction it is ("1.41" as \\frac{141}{100}): math-verify rounds
    decimals to 6 places, which made 1.4142136 equal \\sqrt{2}."""
    return DECIMAL.sub(lambda m: f"\\frac{{{int(m[1] + m[2])}}}{{{10 ** len(m[2])}}}", latex)


def answers_match(candidate: str, reference: str) -> bool:
    """Whether two final answers are equal: as numbers when the reference is one (see ``numeric_answer``),
    else by math-verify on the whole answer (see ``unsupported_by_reference``)."""
    expected = reference_number(reference)
    if expected is not None:
        stated = numeric_answer(candidate)[0]
        return stated is not None and numbers_equal(stated, expected)
    if unsupported_by_reference(candidate, reference):
        return False
    return _latex_match(_exact_decimals(without_framing_words(candidate)), _exact_decimals(reference))


def _refusal(answer: str, reference: str) -> str:
    """Why one final answer is refused before it is compared, or ''."""
    if reference_number(reference) is not None:
        return numeric_answer(answer)[1]
    return unsupported_by_reference(answer, reference)


class MathVerifier:
    """Correct if every final answer the response states equals the reference; score 1.0 or 0.0."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        reference = _ascii_minus(reference)
        answers, how = final_answers(_ascii_minus(response))
        if not answers:
            return RewardResult(0.0, False, {"extracted": None, "reason": "no answer found"})
        main, distinct = answers[-1], list(dict.fromkeys(answers))
        if len(distinct) > MOST_FINAL_ANSWERS:
            return RewardResult(0.0, False, {"extracted": main, "reason": "too many final answers"})
        verdicts = [
            (answer, _refusal(answer, reference) or ("" if answers_match(answer, reference) else "not the reference"))
            for answer in distinct
        ]
        wrong = [(answer, reason) for answer, reason in verdicts if reason]
        if not wrong:
            return RewardResult(1.0, True, {"extracted": main, "found_by": how})
        if len(wrong) < len(verdicts):
            reason = f"several final answers that disagree: {wrong[0][0]!r} is wrong"
        else:
            reason = dict(wrong).get(main, wrong[-1][1])
        return RewardResult(0.0, False, {"extracted": main, "reason": reason})
