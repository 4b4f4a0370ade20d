"""Split a test program into test cases.

A test program is Python source:

* every top-level ``assert`` is one test case (``assert True``-style constant asserts are dropped);
* a top-level call ``check(X)`` of a function ``check`` whose body asserts (HumanEval's form) gives
  one test case per assert-holding statement of that body: each case keeps the body's other
  statements (setup such as ``import math``) and drops the other asserts;
* any other top-level statement that holds an assert (a ``for`` loop of asserts) is one case;
* everything else (imports, helper functions, ``METADATA``, ``def check``) is setup, run before
  every case.

Without a ``check(X)`` call, a defined ``check`` is called with ``entry_point`` (HumanEval's test
field alone, without its call).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

CHECK = "__check__"


@dataclass(frozen=True)
class TestPlan:
    """A test program split into setup code and independent test cases."""

    __test__ = False  # not a pytest test class

    setup: str
    """Code run before every case (imports, helpers, definitions)."""

    cases: tuple[str, ...]
    """One snippet per test case, run in the judge with the solution's functions as remote proxies."""


def _asserts(node: ast.AST) -> bool:
    """Whether ``node`` holds a non-constant assert that runs when the statement runs (not in a nested def)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Assert) and not isinstance(current.test, ast.Constant):
            return True
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(child)
    return False


def _is_test_statement(node: ast.stmt) -> bool:
    return not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _asserts(node)


def _split_check(function: ast.FunctionDef, argument: ast.expr) -> list[str]:
    """One snippet per assert-holding statement of ``function``'s body, each calling it with ``argument``."""
    tests = [i for i, stmt in enumerate(function.body) if _is_test_statement(stmt)]
    if not tests:
        tests = [-1]  # asserts only in nested code: the whole call is one case
    snippets = []
    for keep in tests:
        body = [stmt for i, stmt in enumerate(function.body) if i == keep or i not in tests] or [ast.Pass()]
        definition = ast.FunctionDef(name=CHECK, args=function.args, body=body, decorator_list=[])
        call = ast.Expr(ast.Call(ast.Name(CHECK, ast.Load()), [argument], []))
        snippets.append(ast.unparse(ast.fix_missing_locations(ast.Module([definition, call], []))))
    return snippets


def _check_call(node: ast.stmt, functions: dict[str, ast.FunctionDef]) -> tuple[str, ast.expr] | None:
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in functions
        and len(node.value.args) == 1
        and not node.value.keywords
        and any(_is_test_statement(s) for s in functions[node.value.func.id].body)
    ):
        return node.value.func.id, node.value.args[0]
    return None


def split_tests(test_code: str, entry_point: str | None = None) -> TestPlan:
    """The setup and the test cases of ``test_code``; ValueError if it does not parse or holds no test."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as exc:
        raise ValueError(f"the tests do not parse: {exc}") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    setup: list[ast.stmt] = []
    cases: list[str] = []
    for node in tree.body:
        check = _check_call(node, functions)
        if check is not None:
            cases.extend(_split_check(functions[check[0]], check[1]))
        elif _is_test_statement(node):
            cases.append(ast.unparse(node))
        else:
            setup.append(node)
    if not cases and "check" in functions and entry_point:
        cases = _split_check(functions["check"], ast.Name(entry_point, ast.Load()))
    if not cases:
        raise ValueError("the tests hold no test case (no assert, and no check(candidate) to call)")
    return TestPlan(ast.unparse(ast.Module(setup, [])), tuple(cases))
