"""The unit of data: one question with its reference answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """A prompt to answer and the reference that scores the answer."""

    id: str
    """Stable identifier (dataset name + row, or the arithmetic problem itself)."""

    question: str
    """The user message (before the prompt template and chat template)."""

    answer: str
    """The reference final answer as a string (a number, or LaTeX for MATH)."""

    task_type: str = "math"
    """Which verifier scores it."""
