"""Render a Config (and its Plan) as YAML, optionally with every field's docstring as a comment."""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from typing import Any

import yaml

from reasonrl.config.docs import field_docs


def _scalar(value: Any) -> str:
    value = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).removesuffix("\n...\n").strip()


def _render(obj: Any, indent: int, comments: bool) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    docs = field_docs(type(obj)) if comments else {}
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name in docs:
            wrapped = textwrap.wrap(" ".join(docs[f.name].split()), width=96 - indent)
            lines.extend(f"{pad}# {line}" for line in wrapped)
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(f"{pad}{f.name}:")
            lines.extend(_render(value, indent + 2, comments))
        else:
            lines.append(f"{pad}{f.name}: {_scalar(value)}")
    return lines


def render_yaml(obj: Any, comments: bool = False) -> str:
    """A (possibly nested) config dataclass as YAML text that ``load_config`` reads back."""
    return "\n".join(_render(obj, 0, comments)) + "\n"
