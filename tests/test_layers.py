"""Nothing imports upward: every import of every module under reasonrl/, those inside functions and
``TYPE_CHECKING`` blocks included, goes to the module's own layer or a lower one."""

import ast
from pathlib import Path

import reasonrl

PACKAGE = Path(reasonrl.__file__).parent
# bottom to top; a module may import its own layer and the layers below it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("algo",),  # pure torch math
    ("config", "batch", "timing", "version"),  # the run's settings, the typed rollout batch, stage timing, version
    ("models", "rollout", "reward", "data"),
    ("train",),
    ("dist",),
    ("eval", "cli", "train_command", "hub", "__main__"),
)
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    """The first component below ``reasonrl`` of a dotted module name (None: outside reasonrl or the package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "reasonrl" and len(parts) > 1 else None


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file of the package at ``root``, relative imports resolved."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            # `from reasonrl import train` names a package, not an attribute
            found += [
                (node.lineno, f"{module}.{alias.name}" if module == "reasonrl" else module) for alias in node.names
            ]
    return found


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """One line per import that goes to a higher layer (or to a part without a layer)."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        source = part_of(".".join(path.relative_to(root.parent).with_suffix("").parts))
        if source is None or source == "__init__":
            continue
        for line, module in imported_modules(path, root):
            target = part_of(module)
            if target is None or target == source or target == "__version__":
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            if source not in LAYER or target not in LAYER:
                problems.append(f"{where}: reasonrl.{source if source not in LAYER else target} has no layer")
            elif LAYER[target] > LAYER[source]:
                problems.append(f"{where}: {source} (layer {LAYER[source]}) imports {module} (layer {LAYER[target]})")
    return problems


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_the_check_names_an_upward_import_inside_a_function(tmp_path):
    root = tmp_path / "reasonrl"
    (root / "models").mkdir(parents=True)
    (root / "models" / "value.py").write_text(
        "from reasonrl.algo.masked import masked_mean\n\n\ndef f():\n    from reasonrl.train.policy import g\n"
    )
    (root / "data").mkdir()
    (root / "data" / "select.py").write_text("from ..train import loop\nfrom .examples import Example\n")
    (root / "widgets.py").write_text("import reasonrl.algo\n")
    assert upward_imports(root) == [
        "reasonrl/data/select.py:1: data (layer 2) imports reasonrl.train (layer 3)",
        "reasonrl/models/value.py:5: models (layer 2) imports reasonrl.train.policy (layer 3)",
        "reasonrl/widgets.py:1: reasonrl.widgets has no layer",
    ]
