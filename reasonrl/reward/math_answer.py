"""What one final answer states, judged by allow-lists: the math verifier's rules for the text beside a value.

Against a numeric reference (``numeric_answer``) the answer is one numeric literal ("12", "-7", "0.5",
"3/4", "1,234", "46%") and the words beside it must all be harmless: framing words (``ANSWER_WORDS``: "The
final answer is 12", "a total of 12"), a name on the other side of "=" ("x = 12"), or a unit or counted
thing (``UNIT_WORDS``, single unit letters such as "12 m" right after the value, and a few words that may
only follow it, ``AFTER_VALUE_WORDS``: "12 more apples", "12 left over").  Any other word, in any language
("12 is wrong", "cannot be 12", "nicht 12", "au moins 12"), any character but plain punctuation, quotes,
currency and "=" ("12? no", "≥ 12", "12!"), a letter beside the value that is no unit ("12k", "e 12") and a
question's word order ("is it 12") make it no answer: refusing an unknown word costs a false negative, a
word read past costs a reward a policy learns to game.

A percent sign on one side only is the GSM8K convention (``numbers_equal``): "25%" is right against "25",
for whole numbers only ("0.5%" is not "0.5" or "1/2").

Against any other reference (``unsupported_by_reference``) the LaTeX answer may use only what cannot hide
a second meaning from math-verify, or what the reference uses too: LaTeX commands of ``SAFE_COMMANDS``
(fractions, roots, functions, constants, Greek letters, spacing, text), ASCII marks of ``SAFE_MARKS`` (no
relation, quote, prime, "&", "|", "%", "?"; no other symbol), one-letter Latin or Greek variables, and words
from the allow-lists above ("and" and "by" too: they join a list).  ``\\approx``, ``\\approxeq``,
``\\le``, ``\\not``, ``\\sim``, ``\\pm``, "≠", ``\\text{ or }``, ``\\mathbf{ is wrong }`` and "不" are
refused unless the reference has them.  The answer's leading framing words are dropped before math-verify
reads it ("The final answer is $\\frac{1}{2}$").
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

# a numeric literal: thousands separators only in groups of three ("1,234"; "4,6" is two numbers)
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
LITERAL = re.compile(rf"-?\d+/\d+(?!\.?\d|,\d)|{NUMBER.pattern}")  # a number, or a fraction "3/4"
LONGEST_LITERAL = 100  # characters (digits in a LaTeX answer); Fraction refuses > 4300 digits
WORD_CHARS = "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff"  # Latin letters, µ included
WORD = re.compile(f"[{WORD_CHARS}]+")
# what may stand beside a number's one literal: words, spaces, punctuation, quotes, currency and "=" (a
# name's); any other character ("+", "²", "√", "!", "?", "≥", "\", "%" away from the value) is refused
PLAIN_TEXT = re.compile(f"[{WORD_CHARS}\\s.,:;()\\[\\]'\"’$€£¥=]*")
NAME = re.compile(f"\\s*[{WORD_CHARS}][{WORD_CHARS}\\s]*")
MARK_AFTER_VALUE = re.compile(r"^\s*([%°])")  # a percent or degree sign right after the value

# words that only frame the value ("The final answer is 12", "a total of 12", "it equals 12", "the area is 12"),
# none that names an operation on it ("product", "root", "average", "times")
ANSWER_WORDS = frozenset({
    "the", "an", "answer", "final", "solution", "result", "value", "total", "sum", "number", "count", "amount",
    "is", "are", "was", "were", "be", "will", "equals", "equal", "to", "of", "so", "therefore", "thus", "hence",
    "it", "there", "we", "you", "she", "he", "they", "has", "have", "had", "get", "gets", "got", "needs", "need",
    "makes", "made", "pays", "paid", "spends", "spent", "earns", "earned", "costs", "cost", "in", "exactly",
    "correct", "our", "my", "her", "his", "their", "percentage", "area", "perimeter", "length", "width", "height",
    "depth", "distance", "speed", "price", "probability", "volume", "age", "radius", "diameter", "weight", "mass",
    "temperature", "profit",
})  # fmt: skip
QUESTION_START = frozenset({"is", "are", "was", "were", "be", "will"})  # "is it 12" asks, it does not state
LEADING_WORD = re.compile(r"\s*([A-Za-z]+)[\s,:]*")
ARTICLES = frozenset({"a", "i"})  # one-letter words before the value, not right before it ("a 12" is a·12)
# words that may only follow the value: "12 more apples", "12 left over", "12 square meters", "12 each"
AFTER_VALUE_WORDS = frozenset({
    "more", "fewer", "less", "left", "leftover", "square", "sq", "cubic", "each", "per", "altogether", "overall",
    "old", "long", "tall", "wide", "deep", "high", "away",
})  # fmt: skip
# unit words that name an operation, a bound or a decimal point before a value ("the square of 12", "min 12",
# "sec 12", "point 5"): allowed only after it
VALUE_NOUNS = frozenset({"square", "cube", "cubic", "sq", "point", "min", "sec", "deg", "rad", "percent", "cent"})
# units and counted things (plural "-s", "-es", "-ies" too), the project's colours and shapes among them
UNIT_WORDS = frozenset({
    "mm", "cm", "dm", "km", "meter", "metre", "millimeter", "centimeter", "kilometer", "inch", "inches", "ft",
    "foot", "feet", "yd", "yard", "mi", "mile", "mg", "kg", "gram", "kilogram", "lb", "lbs", "pound", "oz",
    "ounce", "ton", "tonne", "ml", "liter", "litre", "gallon", "quart", "pint", "cup", "sec", "second", "min",
    "minute", "hr", "hrs", "hour", "day", "week", "month", "year", "decade", "century", "mph", "kph", "degree",
    "deg", "radian", "rad", "percent", "cent", "dollar", "usd", "euro", "eur", "yen", "rupee", "unit", "point",
    "red", "green", "blue", "yellow", "black", "white", "orange", "purple", "pink", "brown", "gray", "grey",
    "square", "circle", "triangle", "rectangle", "shape", "star", "dot", "cube", "sphere", "item", "object",
    "thing", "piece", "people", "person", "student", "child", "children", "kid", "friend", "boy", "girl", "man",
    "men", "woman", "women", "apple", "egg", "cookie", "candy", "book", "page", "car", "box", "bag", "ball",
    "marble", "card", "pen", "pencil", "toy", "animal", "dog", "cat", "bird", "fish", "tree", "flower", "way",
    "outcome", "integer", "digit", "term", "row", "column", "seat", "ticket", "slice", "pizza",
    "bottle", "glass", "shirt", "house", "room", "game", "step", "move", "tile", "side", "edge", "vertex",
    "vertices", "face", "coin", "stamp", "sticker", "bead", "chair", "table", "pie", "cake",
})  # fmt: skip
# one-letter units that may follow a number; any other letter ("12x", "12i", "12e", "12k") is a variable, a
# constant or a scale
UNIT_LETTERS = frozenset("mgshlLVWAJNCF")
# a unit's exponent: "cm^2", "m^{3}", "m²"
UNIT_POWER = re.compile(f"(?<![{WORD_CHARS}])([{WORD_CHARS}]+)\\s*(?:\\^\\s*(?:\\{{\\s*[23]\\s*\\}}|[23])|[²³])")
TEXT_COMMAND = (
    r"\\(?:text|textrm|textnormal|textbf|textit|textsf|texttt|textup|mathrm|mathbf|mathit|mathsf|mathtt|"
    r"operatorname|mbox|hbox|emph)"
)

# LaTeX commands that state a value without a relation, a bound or a word math-verify would read past
SAFE_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "cfrac", "sqrt", "left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr",
    "Bigl", "Bigr", "in", "displaystyle", "textstyle", ",", ";", ":", "!", " ", "quad", "qquad", "{", "}", "$", "boxed",
    "cdot", "times", "div", "pi", "infty", "circ", "degree", "ldots", "cdots", "dots", "sin", "cos", "tan", "cot",
    "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log", "ln", "exp", "binom", "dbinom",
    "tbinom", "cup", "cap", "emptyset", "varnothing", "mathbb", "alpha", "beta", "gamma", "delta", "epsilon",
    "varepsilon", "theta", "vartheta", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "phi", "varphi", "chi",
    "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi", "Omega",
    "text", "textrm", "textnormal", "textbf", "textit", "textsf", "texttt", "textup", "mathrm", "mathbf", "mathit",
    "mathsf", "mathtt", "operatorname", "mbox", "hbox", "emph",
})  # fmt: skip
SAFE_MARKS = frozenset("+-*/^_=()[]{}.,;:!$\\")  # with ASCII letters, digits and spaces
ASCII_RELATION = re.compile(r"!=|=/|/=|==")  # "!=" and "=/=" are relations made of safe marks
COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
LETTERS = re.compile(r"[^\W\d_]+")  # a run of letters, any script
SYMBOL_LETTER = re.compile("[A-Za-z\u0370-\u03ff]")  # a one-letter variable or constant: Latin or Greek
LIST_WORDS = frozenset({"and", "by"})  # a LaTeX answer's list: "3 \text{ and } 5", "12 \text{ cm by } 5"


class StatedNumber(NamedTuple):
    """The number an answer states, and whether it carries a percent sign (or the word "percent")."""

    value: Fraction
    percent: bool


def numbers_equal(stated: StatedNumber, expected: StatedNumber) -> bool:
    """Whether a stated number is the reference's.  A percent on one side only is the GSM8K convention (a
    percent question whose reference is the plain "25", answered "25%"); it holds for whole numbers only:
    a decimal or fraction may be a proportion, and 0.5% (0.005) is not 1/2."""
    if stated.value != expected.value:
        return False
    return stated.percent == expected.percent or stated.value.denominator == 1


def _forms(word: str) -> set[str]:
    """A word in lower case, and the singulars it may be the plural of ("boxes": box, boxe, boxes)."""
    lowered = word.lower()
    forms = {lowered}
    for plural, single in (("ies", "y"), ("es", ""), ("s", "")):
        if lowered.endswith(plural) and len(lowered) > len(plural) + 2:
            forms.add(lowered[: -len(plural)] + single)
    return forms


def is_unit_word(word: str, before_value: bool = False) -> bool:
    """Whether a word of two or more letters names a unit or a counted thing ("cm", "apples", "boxes",
    "candies", "red"); ``before_value``: not one that may also name an operation or a bound there."""
    forms = _forms(word)
    return len(word) > 1 and bool(forms & UNIT_WORDS) and not (before_value and forms & VALUE_NOUNS)


def plain_answer(text: str) -> str:
    """The answer without presentation: math delimiters, markdown, LaTeX text commands, spacing, \\left and
    \\right, currency, a unit's exponent ("cm^2"), "^\\circ" as "°", "km/h" as "km per h", and a fraction of
    two integer literals as "a/b"."""
    text = re.sub(rf"{TEXT_COMMAND}\s*\{{([^{{}}]*)\}}", r"\1", text)
    text = re.sub(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}", r"\1/\2", text)
    text = re.sub(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ)", "°", text)
    for latex, plain in (("\\$", ""), ("\\%", "%"), ("\\!", ""), ("\\,", ""), ("\\(", ""), ("\\)", ""), ("{,}", ",")):
        text = text.replace(latex, plain)
    text = re.sub(r"\\(?:;|quad|qquad|:|left|right)(?![A-Za-z])", " ", text)
    text = UNIT_POWER.sub(lambda m: m[1] if is_unit_word(m[1]) or m[1] in UNIT_LETTERS else m[0], text)
    text = re.sub(f"(?<=[{WORD_CHARS}])/(?=[{WORD_CHARS}])", " per ", re.sub(r"[*_`]+", " ", text))  # "m/s"
    return text.strip().strip("$ ").rstrip(".").strip()


def _literal_value(literal: str) -> Fraction | None:
    if len(literal) > LONGEST_LITERAL:
        return None
    numerator, _, denominator = literal.replace(",", "").partition("/")
    if denominator and int(denominator) == 0:
        return None
    return Fraction(numerator) / Fraction(denominator or 1)


def reference_number(reference: str) -> StatedNumber | None:
    """The reference as a number when it is one and nothing else: "1,234", "-7", "0.5", "3/4", "46%"."""
    cleaned = plain_answer(reference)
    percent = cleaned.endswith("%")
    cleaned = cleaned.removesuffix("%").strip()
    if not LITERAL.fullmatch(cleaned) or (value := _literal_value(cleaned)) is None:
        return None
    return StatedNumber(value, percent)


def without_framing_words(answer: str) -> str:
    """A LaTeX answer without the framing words it starts with ("The final answer is $\\frac{1}{2}$" as
    "$\\frac{1}{2}$"), which math-verify would read as variables; a question ("is it ...") keeps them."""
    position = 0
    while (word := LEADING_WORD.match(answer, position)) and word[1].lower() in ANSWER_WORDS:
        if position == 0 and word[1].lower() in QUESTION_START:
            return answer
        position = word.end()
    return answer[position:]


def _unknown_word(words: list[str], side: str) -> str:
    """The first word of one side of the value that is not allowed there, or ''.  ``side``: 'before' (the
    words up to the value), 'after' (from the value on) or 'name' (another side of an "=")."""
    for i, word in enumerate(words):
        lowered = word.lower()
        if lowered in ANSWER_WORDS or is_unit_word(word, before_value=side != "after"):
            continue
        if side == "name" and len(word) == 1:  # "x = 12"
            continue
        if side == "before" and lowered in ARTICLES and i < len(words) - 1:  # "a total of 12", not "a 12"
            continue
        if side == "after" and (
            lowered in AFTER_VALUE_WORDS
            or (word in UNIT_LETTERS and (i == 0 or words[i - 1].lower() == "per"))  # "12 m", "12 km/h"
            or (lowered == "over" and i > 0 and words[i - 1].lower() == "left")
        ):
            continue
        return word
    return ""


def _value_changed_around(before: str, after: str) -> str:
    """Why the text around an answer's one literal is more than harmless words, or '' when it is not."""
    if not PLAIN_TEXT.fullmatch(before + after):
        return "an expression or a relation: an operator, mark or symbol beside the number"
    before_sides, after_sides = before.split("="), after.split("=")
    names = before_sides[:-1] + after_sides[1:]
    if not all(NAME.fullmatch(name) for name in names):
        return "an equation whose other side is not a name"
    words_before = WORD.findall(before)
    if words_before and words_before[0].lower() in QUESTION_START:
        return f"a question, not a statement ({' '.join(words_before[:2])!r} ...)"
    if re.search(f"[{WORD_CHARS}]$", before_sides[-1]):
        return "a letter glued to the number: a variable, a constant or a scale (x12, 12k), not a number"
    unknown = (
        _unknown_word(WORD.findall(" ".join(names)), "name")
        or _unknown_word(WORD.findall(before_sides[-1]), "before")
        or _unknown_word(WORD.findall(after_sides[0]), "after")
    )
    if unknown:
        return f"a word beside the number that is not known to leave it unchanged: {unknown!r}"
    return ""


def numeric_answer(text: str) -> tuple[StatedNumber | None, str]:
    """(the number an answer states, '') or (None, why it states none): one numeric literal and only
    harmless words around it (see the module docstring)."""
    cleaned = plain_answer(text)
    literals = list(LITERAL.finditer(cleaned))
    if not literals:
        return None, "no number in the answer"
    if len(literals) > 1:
        return None, "several numbers: an expression or several answers, not one number"
    literal = literals[0]
    value = _literal_value(literal.group())
    if value is None:
        return None, "a number too long to be an answer, or a fraction over zero"
    before, after = cleaned[: literal.start()], cleaned[literal.end() :]
    mark = MARK_AFTER_VALUE.match(after)
    after = after[mark.end() :] if mark else after
    if reason := _value_changed_around(before, after):
        return None, reason
    says_percent = bool(re.match(r"\s*(?:percent|per\s+cent)\b", after, re.IGNORECASE))
    return StatedNumber(value, bool(mark and mark[1] == "%") or says_percent), ""


def _vocabulary(latex: str) -> tuple[set[str], set[str], set[str]]:
    """(commands, marks, words) of a LaTeX text: marks are the characters and ASCII relations outside the
    safe ones, words the lower-case letter runs outside command names."""
    commands = set(COMMAND.findall(latex))
    marks = {c for c in latex if not ((c.isascii() and c.isalnum()) or c.isspace() or c in SAFE_MARKS or c.isalpha())}
    marks |= set(ASCII_RELATION.findall(latex))
    words = {word.lower() for word in LETTERS.findall(COMMAND.sub(" ", latex))}
    return commands, marks, words


def unsupported_by_reference(candidate: str, reference: str) -> str:
    """Why a LaTeX answer is refused before math-verify reads it, or '': a command, mark or word that is
    neither known to be safe nor used by the reference (math-verify may read past it), or too many digits
    to compare exactly."""
    if sum(char.isdigit() for char in candidate) > LONGEST_LITERAL:
        return "too many digits to be an answer"
    commands, marks, words = _vocabulary(candidate)
    ref_commands, ref_marks, ref_words = _vocabulary(reference)
    ref_words |= {command.lower() for command in ref_commands}
    extra = sorted(f"\\{c}" for c in commands - SAFE_COMMANDS - ref_commands) + sorted(marks - ref_marks)
    extra += sorted(
        word
        for word in words - ref_words - ANSWER_WORDS - LIST_WORDS
        if not (SYMBOL_LETTER.fullmatch(word) or is_unit_word(word, before_value=True))
    )
    return f"uses {' '.join(extra)[:200]}, which the reference does not (a relation, mark or word)" if extra else ""
