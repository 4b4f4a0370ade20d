"""The math verifier: extract the final answer, then compare the whole of it with the reference.

Extraction order: the last non-empty ``\\boxed{...}``; else the last "Answer: ..." line (also "final
answer is ..."); else the last number in the response.  Every dash a minus sign is written with (U+2212,
the en dash, the fullwidth hyphen-minus, ...) reads as "-" first, so "−12" is minus twelve.

Comparison: the whole stated value counts.  When the reference is a number, the answer must be one number
too — a single numeric literal, with words around it allowed ("3 red squares", "x = 4") and nothing that
changes its value: no operator, relation or other symbol ("47 + 38", "12²", "√144", "12!", "≥ 12"), no
second number or number word ("5 or 7", "twelve or 13"), no word that negates, bounds, hedges, combines
or scales it ("not 12", "at least 12", "about 12", "12 or more", "12 thousand"; "≈"/"about" too: an
approximation is not the value), and no letter glued to it or standing alone beside it ("12k", "12i",
"x12", "e 12"; single-letter units such as "12m" or "12 s" are words).  Units are not compared ("12 cm"
is right against "12 m").  Otherwise math-verify compares LaTeX, fractions, intervals and the like, on
the whole answer: unit words after a value are dropped first (math-verify stops reading at the first
unit, which would leave a list's later values unread), the answer may use a relation, negation,
non-ASCII symbol or value word that math-verify reads past (``\\approx``, ``\\neq``, a prime, ``≠``,
``\\text{ thousand}``) only where the reference uses it too, and an equation is right only when every
side but a bare name equals the reference (``\\sqrt3=\\sqrt2`` is wrong against ``\\sqrt2``).  A final
"Answer:" line that names several different values is not rewarded.
"""

from __future__ import annotations

import re
from fractions import Fraction

from reasonrl.reward.verifier_protocol import RewardResult

# a numeric literal: thousands separators only in groups of three ("1,234"; "4,6" is two numbers)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
# the form the prompt template asks for: a line that starts with "Answer:" (a later "... this answer is
# correct." must not replace it)
TEMPLATE_ANSWER_LINE = re.compile(r"^[ \t]*(?:final answer|answer)[ \t]*:[ \t]*(.+)", re.IGNORECASE | re.MULTILINE)
BOXED = re.compile(r"\\boxed\s*\{")
# every dash a minus sign is written with: hyphen, non-breaking hyphen, figure, en and em dash, horizontal
# bar, hyphen bullet, minus sign, modifier and heavy minus, two- and three-em dash, small and fullwidth
# hyphen-minus
DASHES = re.compile("[\u2010-\u2015\u2043\u2212\u02d7\u2796\u2e3a\u2e3b\ufe58\ufe63\uff0d]")
WORD_CHARS = "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff"  # Latin letters, µ included
WORD = re.compile(f"[{WORD_CHARS}]+")
# what may stand beside a number's one literal: words, spaces, punctuation, quotes, currency, percent and
# degree signs, and "=" after a name; any other character ("+", "²", "√", "!", "≥", "\") makes it an
# expression or a relation
PLAIN_TEXT = re.compile(f"[{WORD_CHARS}\\s.,:;()\\[\\]'\"’$€£¥%°=]*")
SUFFIX_MARK = re.compile("[%°]")  # percent and degree signs follow their number ("%12" is no number)
NAME = re.compile(f"\\s*[{WORD_CHARS}][{WORD_CHARS}\\s]*")
# words that negate, bound, hedge, combine or transform the value beside them
VALUE_WORDS = frozenset({
    "not", "no", "never", "non", "neither", "nor", "none", "except", "excluding", "without", "besides", "instead",
    "unlike", "or", "either", "than", "least", "most", "above", "below", "beyond", "exceed", "exceeds", "exceeding",
    "up", "upto", "upwards", "excess", "between", "within", "max", "maximum", "min", "minimum", "approximately",
    "approx", "approximate", "about", "around", "roughly", "nearly", "almost", "circa", "ca", "close", "estimated",
    "estimate", "minus", "negative", "plus", "times", "divided", "multiplied", "squared", "cubed", "power", "root",
    "sqrt", "factorial", "reciprocal", "inverse", "opposite", "but", "pi", "ish", "mod", "modulo", "log", "ln",
    "exp", "sin", "cos", "tan", "infinity", "infinite", "unequal", "different",
})  # fmt: skip
BOUNDS_BEFORE = frozenset({"over", "under"})  # "over 12" bounds the value; "12 left over" does not
# a negated verb ("isn't 12") and an open bound ("12 and more"; "12 more apples" is a count)
NEGATION_OR_BOUND = re.compile(
    r"n['’]t\b|\band\s+(?:higher|lower|more|less|fewer|greater|smaller|larger|bigger|over|under|upwards?)\b",
    re.IGNORECASE,
)
# words that name a number (plural "-s" too): beside a literal, the answer names two numbers
NUMBER_WORDS = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty",
    "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million", "billion", "trillion",
    "dozen", "half", "halves", "third", "quarter", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "hundredth", "thousandth", "millionth", "twice", "thrice", "double", "triple", "once", "nil", "nought",
    "naught", "bn", "mn", "mil", "lakh", "crore",
})  # fmt: skip
ROMAN_NUMERAL = re.compile(r"[IVXLCDM]{2,}")
# one-letter words that may follow a number as its unit; any other ("12x", "12i", "12e", "12k") is a
# variable, a constant or a scale
UNIT_LETTERS = frozenset("mgshlLVWAJNCF")
# relations, separators and marks math-verify reads past: "\sqrt2 \approx 1.41", "\sqrt{2}'" and "=/= \sqrt2"
# parse as \sqrt2, "5 & \sqrt2", "5 \\ \sqrt2" and "5 | \sqrt2" as \sqrt2
RELATION = re.compile(
    r"\\(?:neq?|not|approx|sim|simeq|cong|equiv|propto|[lg]eq?(?:slant)?|[lg]t|lesssim|gtrsim|ll|gg|pm|mp|mid|"
    r"vee|lor|wedge|land)(?![A-Za-z])|\\\\|!=|=/|/=|[<>'\"&|]"
)
MATH_DELIMITER = re.compile(r"\\?\$|\\[()\[\]]")  # "$", "\$", "\(", "\[": they carry no value
TEXT_COMMAND = r"\\(?:text|textrm|textnormal|textbf|textit|mathrm|mbox)"
LATEX_TEXT = re.compile(rf"({TEXT_COMMAND})\s*\{{([^{{}}]*)\}}")  # (command, words)
# one-word \text{}s after a value, with LaTeX spacing and a unit's exponent: "12\,\text{m}^2", "5 \text{cm}"
UNITS_AFTER_VALUE = re.compile(
    rf"(?P<value>[\d}})])(?P<units>(?:(?:\s|\\[,;:! ]|\\q?quad)*{TEXT_COMMAND}\s*\{{[{WORD_CHARS}]+\}}"
    r"(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?)+)"
)
KEPT_AFTER_VALUE = frozenset({"and", "e", "i"})  # a list's "and"; "2\mathrm{i}" is a value, not 2 of a unit
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


def _ascii_minus(text: str) -> str:
    """``text`` with every dash a minus sign is written with as "-"."""
    return DASHES.sub("-", text)


def _unwrapped(text: str) -> str:
    """The answer without presentation: math delimiters, markdown emphasis, \\text{}, LaTeX spacing and
    currency, and a fraction of two integer literals as "a/b"; its dashes as "-"."""
    text = re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r"\1", _ascii_minus(text))
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


def _names_number(word: str) -> bool:
    """Whether a word names a number: "twelve", "dozens", "XIII"."""
    lowered = word.lower()
    return lowered in NUMBER_WORDS or lowered.removesuffix("s") in NUMBER_WORDS or bool(ROMAN_NUMERAL.fullmatch(word))


def _changes_value(word: str) -> bool:
    """Whether a word beside a value changes it: a number word or a value word ("not", "about", "or")."""
    return word.lower() in VALUE_WORDS or _names_number(word)


def _value_changed_around(before: str, after: str) -> str:
    """Why the text around an answer's one literal changes its value, or '' when it does not."""
    if not PLAIN_TEXT.fullmatch(before + after) or SUFFIX_MARK.search(before):
        return "an expression, not a number: an operator, relation or symbol beside the number"
    sides = before.split("=")[:-1] + after.split("=")[1:]
    if not all(NAME.fullmatch(side) for side in sides):
        return "an equation whose other side is not a name"
    around = before + " " + after
    if (
        any(word.lower() in VALUE_WORDS for word in WORD.findall(around))
        or any(word.lower() in BOUNDS_BEFORE for word in WORD.findall(before))
        or NEGATION_OR_BOUND.search(around)
    ):
        return "a word that negates, bounds, hedges or changes the number"
    factor = re.search(f"(?<![{WORD_CHARS}])[{WORD_CHARS}]\\s*$|[{WORD_CHARS}]$", before)  # "e 12", "x12"
    unit = re.match(f"\\s*([{WORD_CHARS}]+)", after)
    if factor or (unit and len(unit[1]) == 1 and unit[1] not in UNIT_LETTERS):
        return "a letter beside the number: a variable, a constant or a scale (12x, 12i, 12k), not a number"
    return ""


def numeric_answer(text: str) -> tuple[Fraction | None, str]:
    """(the number an answer states, '') or (None, why it states none): one numeric literal, words
    around it allowed, and nothing that changes its value (see the module docstring)."""
    number = _as_number(text)
    if number is not None:
        return number, ""
    cleaned = _unwrapped(text)
    literals = list(NUMBER.finditer(cleaned))
    if not literals:
        return None, "no number in the answer"
    if len(literals) > 1 or any(_names_number(word) for word in WORD.findall(cleaned)):
        return None, "several numbers: an expression or several answers, not one number"
    literal = literals[0]
    if reason := _value_changed_around(cleaned[: literal.start()], cleaned[literal.end() :]):
        return None, reason
    number = _literal(literal.group())
    return number, "" if number is not None else "a number too long to be an answer"


def _distinct_numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def _value_changers(latex: str) -> set[str]:
    """The relations, marks, non-ASCII symbols and value words (in ``\\text{}``) of a LaTeX answer."""
    symbols = {char for char in latex if ord(char) > 127 and not char.isalpha() and not char.isspace()}
    words = {
        word.lower() for _, text in LATEX_TEXT.findall(latex) for word in WORD.findall(text) if _changes_value(word)
    }
    return set(RELATION.findall(latex)) | symbols | words


def unsupported_by_reference(candidate: str, reference: str) -> str:
    """Why a LaTeX answer is refused before math-verify reads it, or '': it uses a relation, mark, symbol
    or value word that the reference does not (math-verify would read past it)."""
    extra = _value_changers(_ascii_minus(candidate)) - _value_changers(_ascii_minus(reference))
    return f"changes the value with {' '.join(sorted(extra))}, which the reference has not" if extra else ""


def _without_units(match: re.Match) -> str:
    """A value and the \\text{} words after it, less its unit words (words that combine or change values
    stay); dropped words between two values ("12 \\text{ cm by } 5") leave a comma, not a product."""
    kept = [
        text.group()
        for text in LATEX_TEXT.finditer(match["units"])
        if _changes_value(text[2]) or text[2].lower() in KEPT_AFTER_VALUE
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
        return verify(gold, prediction)
    values = [side for side in sides if not isinstance(side, Symbol | AppliedUndef)]
    return bool(values) and all(verify(gold, value) for value in values)


def answers_match(candidate: str, reference: str) -> bool:
    """Whether two final answers are equal: as numbers when the reference is one (see
    ``numeric_answer``), else by math-verify on the whole answer (see ``unsupported_by_reference``)."""
    expected = _as_number(reference)
    if expected is not None:
        return numeric_answer(candidate)[0] == expected
    if unsupported_by_reference(candidate, reference):
        return False
    return _latex_match(candidate, reference)


class MathVerifier:
    """Correct if the extracted final answer equals the reference; score 1.0 or 0.0."""

    def __call__(self, response: str, reference: str) -> RewardResult:
        answer, how = extract_answer(_ascii_minus(response))
        if answer is None:
            return RewardResult(0.0, False, {"extracted": None, "reason": "no answer found"})
        if _as_number(reference) is not None:
            reason = numeric_answer(answer)[1]
        elif how == "answer_line" and _as_number(answer) is None and len(_distinct_numbers(answer)) > 1:
            reason = "several different answers"
        else:
            reason = unsupported_by_reference(answer, reference)
        if reason:
            return RewardResult(0.0, False, {"extracted": answer, "reason": reason})
        correct = answers_match(answer, reference)
        return RewardResult(float(correct), correct, {"extracted": answer, "found_by": how})
