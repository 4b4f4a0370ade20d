"""Size budgets of the package, so that each module and function reads in one sitting: a file of at most 500
lines, a function of at most 80.  The exceptions are listed here, each with its reason; a split that brings one
under its budget takes it off the list (the list is checked for entries that no longer need it)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reasonrl"
FILE_LINES = 500
FUNCTION_LINES = 80

LONG_FILES: dict[str, str] = {}
"""``"path"``: why it stays longer than FILE_LINES (none today: the schema's rollout group is its own module)."""
LONG_FUNCTIONS: dict[str, str] = {}
"""``"path:function"``: why it stays longer than FUNCTION_LINES (none today)."""


def long_files(sources: dict[str, str]) -> dict[str, int]:
    """The files of ``sources`` (path: text) longer than FILE_LINES, with their line counts."""
    return {path: n for path, text in sources.items() if (n := len(text.splitlines())) > FILE_LINES}


def long_functions(sources: dict[str, str]) -> dict[str, int]:
    """The functions and methods of ``sources`` longer than FUNCTION_LINES (decorators excluded), as
    ``"path:name"`` with their line counts."""
    found = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES:
                found[f"{path}:{node.name}"] = n
    return found


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_file_is_within_its_budget_or_listed_with_its_reason():
    over = {path: n for path, n in long_files(package_sources()).items() if path not in LONG_FILES}
    assert not over, f"files over {FILE_LINES} lines (split them, or list them with a reason): {over}"


def test_every_function_is_within_its_budget_or_listed_with_its_reason():
    over = {name: n for name, n in long_functions(package_sources()).items() if name not in LONG_FUNCTIONS}
    assert not over, f"functions over {FUNCTION_LINES} lines (split them, or list them with a reason): {over}"


def test_the_exceptions_are_still_needed():
    sources = package_sources()
    assert set(LONG_FILES) <= set(long_files(sources)), "a listed file is within its budget now: unlist it"
    assert set(LONG_FUNCTIONS) <= set(long_functions(sources)), "a listed function is within its budget now"


def test_the_budgets_see_long_files_and_long_functions():
    method = "class A:\n    def method(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(FUNCTION_LINES))
    sources = {"short.py": "def f():\n    return 1\n", "long_function.py": method, "long_file.py": "x = 1\n" * 501}
    assert long_functions(sources) == {"long_function.py:method": FUNCTION_LINES + 1}
    assert long_files(sources) == {"long_file.py": FILE_LINES + 1}
