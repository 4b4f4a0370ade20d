"""Field docstrings of the configuration dataclasses (the string literal under each field)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from itertools import pairwise


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each annotated field of dataclass ``cls`` to the docstring written under it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # the class body
    docs: dict[str, str] = {}
    for node, following in pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs
