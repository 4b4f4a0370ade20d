"""Process rewards for code (Dai et al., arXiv 2410.17621): the lines of a response, and the
binary-search line labels of the paper's Algorithm 1.

A line prefix is *alive* when at least one of K completions sampled from it passes every unit test.
Aliveness is monotone along the program (a prefix nothing can complete is not rescued by more lines),
so the first dead line is found by binary search, ``first_dead_line``: lines before it are labelled 1,
lines from it on 0; a program that passes is all 1.  Labels are stored as feasibility in {0, 1}; the
shaping maps them to the reward scale (docs/algorithms.md, "Process rewards for code").

Lines (the paper leaves the segmentation open): newline-terminated lines of the response's text, a
blank line merged into the line before it (leading blank lines into the first line), the last line
ending at the last token.  Each line ends at a *line-end token*: the token that holds its newline
(with a tokenizer that merges "\\n" with the next indentation, that token also starts the next line).
Comment lines (``#`` after indentation) are *neutral*: the paper gives them no dense reward (§4.3.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """One line of a response."""

    text: str  # its characters, newline included (and any blank lines merged into it)
    end_token: int  # index, in the response's tokens, of the token that ends it
    neutral: bool  # a comment line: labelled like the others, but given no dense reward

    def to_json(self) -> list:
        return [self.text, self.end_token, self.neutral]

    @staticmethod
    def from_json(row: Sequence) -> Line:
        text, end_token, neutral = row
        return Line(str(text), int(end_token), bool(neutral))


def token_char_ends(tokenizer, token_ids: Sequence[int]) -> list[int]:
    """For each token, the length of the text the tokens up to it decode to (special tokens skipped)."""
    return [len(tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)) for i in range(len(token_ids))]


def response_lines(text: str, char_ends: Sequence[int]) -> list[Line]:
    """The lines of a response (module docstring) from its decoded ``text`` and ``token_char_ends``.

    A line whose newline lies in the text of no token (cannot happen with a consistent decode) ends at
    the last token."""
    if not char_ends:
        return []
    pieces = text.splitlines(keepends=True)
    lines: list[list] = []  # [text, end_char]
    pending, position = "", 0
    for piece in pieces:
        position += len(piece)
        if not piece.strip():  # blank: merged into the line before (or, at the start, the next one)
            if lines:
                lines[-1][0] += piece
                lines[-1][1] = position
            else:
                pending += piece
            continue
        lines.append([pending + piece, position])
        pending = ""
    if pending and not lines:
        lines.append([pending, position])
    result = []
    for line_text, end_char in lines:
        # the token whose text reaches the line's last character (its newline)
        end_token = next((i for i, end in enumerate(char_ends) if end >= end_char), len(char_ends) - 1)
        result.append(Line(line_text, end_token, line_text.lstrip().startswith("#")))
    return result


class DeadLineSearch:
    """The binary search of ``first_dead_line`` as a state machine, so many programs' searches can
    advance together (one engine call samples the completions of many prefixes): ask ``query`` (the
    line prefix to probe, None when done), ``tell`` it whether that prefix is alive, read ``result``."""

    def __init__(self, n_lines: int) -> None:
        self.n_lines = n_lines
        self.low, self.high = 1, n_lines + 1  # the answer is in [low, high]; n_lines + 1 stands for "none"

    @property
    def query(self) -> int | None:
        return (self.low + self.high) // 2 if self.low < self.high else None

    def tell(self, alive: bool) -> None:
        middle = self.query
        if middle is None:
            raise RuntimeError("the search is over: nothing was asked")
        if alive:
            self.low = middle + 1
        else:
            self.high = middle

    @property
    def result(self) -> int | None:
        return None if self.low > self.n_lines else self.low


def first_dead_line(prefix_alive: Callable[[int], bool], n_lines: int) -> int | None:
    """The smallest ℓ in 1..n_lines whose prefix of ℓ lines is dead (``prefix_alive(ℓ)`` False), or None
    when every prefix is alive; ``prefix_alive`` must be monotone (alive at ℓ ⇒ alive before ℓ).

    Binary search over the n_lines + 1 possible answers: ceil(log2(n_lines + 1)) ≤ ceil(log2 n_lines) + 1
    calls (the paper's Algorithm 1 costs K completions per call)."""
    search = DeadLineSearch(n_lines)
    while (line := search.query) is not None:
        search.tell(prefix_alive(line))
    return search.result


def search_calls_at_most(n_lines: int) -> int:
    """The most ``prefix_alive`` calls ``first_dead_line`` makes for ``n_lines`` lines."""
    return math.ceil(math.log2(n_lines + 1)) if n_lines else 0


def line_labels(first_dead: int | None, n_lines: int) -> list[int]:
    """1 for each line before the first dead line, 0 from it on (all 1 when no line is dead)."""
    alive = n_lines if first_dead is None else first_dead - 1
    return [1] * alive + [0] * (n_lines - alive)
