"""The unit of data: one question with its reference answer, and the error of a row that cannot be one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """A prompt to answer and the reference that scores the answer."""

    id: str
    """Stable identifier (dataset name + row, or the arithmetic problem itself)."""

    question: str
    """The user message (before the prompt template and chat template); for a chat-format prompt, the
    content of its last user message."""

    answer: str
    """The reference final answer as a string (a number, or LaTeX for MATH)."""

    task_type: str = "math"
    """Which verifier scores it."""

    messages: tuple[dict[str, str], ...] = ()
    """A chat-format prompt (the row's ``prompt`` as a list of {role, content} messages), sent through
    the chat template as it is, without the prompt template; empty = ask ``question`` through it."""

    data_source: str = ""
    """Where the example comes from: the row's ``data_source`` column, else the dataset's name (per-source
    evaluation metrics; custom reward functions receive it)."""

    fields: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The row's other columns (JSON values), passed to custom reward functions as keyword arguments."""

    images: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    """The prompt's images (PIL images), shown before its text; empty for a text prompt. Only a
    vision-language model can answer a prompt with images."""


class RowError(ValueError):
    """A dataset row that a converter (a code task's, a preference transcript's) cannot read; the loader
    reports it as a DataError."""
