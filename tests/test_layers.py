"""Nothing imports upward, and nothing imports in a circle.

Every package and top-level module of ``reasonrl/`` has a rank; every import of every module, those inside
functions and ``TYPE_CHECKING`` blocks included, goes to its own part or a part of the same or a lower rank.
Within that order no import cycle may remain either: the graph of module -> the modules of the package it
imports has no strongly connected component of more than one module."""

import ast
from collections import Counter
from pathlib import Path

import reasonrl

PACKAGE = Path(reasonrl.__file__).parent
# bottom to top; a part may import its own rank and the ranks below it
RANKS: tuple[tuple[str, ...], ...] = (
    ("algo", "errors"),  # pure torch math; the root of the errors a user reads
    # the run's settings, the typed rollout batch, stage timing and progress, the version, whether the Hub answers
    ("config", "batch", "packing", "timing", "version", "hub_access"),
    ("data",),  # examples, datasets, prompts and their encodings, offline datasets
    ("models",),  # loading models, LoRA, value models
    ("reward",),  # verifiers, judges, reward models and the router that scores with them
    ("rollout",),  # engines and conversations; rollout.scored samples with an engine and scores with a reward scorer
    ("training",),  # the RL run
    ("jobs", "dist"),  # the side jobs (eval, data, rm, prm, vlm, push); scale-out on Ray
    ("train_command",),  # `reasonrl train`: one process, torchrun or Ray
    ("cli", "api"),  # the command line; the Python API (reasonrl.train(...))
    ("__main__",),
)
RANK = {part: rank for rank, parts in enumerate(RANKS) for part in parts}
# inside a part, bottom to top: its sub-packages, and its own modules as ""
INNER_RANKS: dict[str, tuple[tuple[str, ...], ...]] = {
    "training": (
        ("placement",),  # the data-parallel group, the CPU threads
        ("record", "update", "rollouts"),  # the run record; the step's update; the step's rollouts
        ("",),  # setup, backend, the composed stages and the loop
    ),
    "rollout": (
        ("",),  # engines behind one protocol
        ("multiturn",),  # conversations, environments, tool calls (they generate with an engine)
    ),
}


def part_of(module: str) -> str | None:
    """The first component below ``reasonrl`` of a dotted module name (None: outside reasonrl or the package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "reasonrl" and len(parts) > 1 else None


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` by its dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(path: Path, root: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in a file of the package at ``root``, relative imports resolved;
    ``from package import name`` names the module ``package.name`` where ``modules`` has one."""
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
            named = (f"{module}.{alias.name}" for alias in node.names)
            found += [(node.lineno, name) for name in dict.fromkeys(n if n in modules else module for n in named)]
    return found


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """One line per import that goes to a higher rank (or to or from a part without a rank)."""
    modules = package_modules(root)
    problems = []
    for name, path in modules.items():
        source = part_of(name)
        if source is None:  # the package's own __init__
            continue
        for line, module in imported_modules(path, root, set(modules)):
            target = part_of(module)
            if target is None or target == source:
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            if source not in RANK or target not in RANK:
                problems.append(f"{where}: reasonrl.{source if source not in RANK else target} has no rank")
            elif RANK[target] > RANK[source]:
                problems.append(f"{where}: {source} (rank {RANK[source]}) imports {module} (rank {RANK[target]})")
    return problems


def inner_part(module: str, packages: set[str]) -> str | None:
    """The sub-package of its part a module is in ("": the part's own modules; None: the part itself)."""
    parts = module.split(".")
    if len(parts) < 3:
        return None
    return parts[2] if ".".join(parts[:3]) in packages else ""


def inner_upward_imports(root: Path = PACKAGE) -> list[str]:
    """One line per import inside a part of ``INNER_RANKS`` that goes to a higher inner rank (or to or from a
    sub-package without one)."""
    modules = package_modules(root)
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    problems = []
    for name, path in modules.items():
        part = part_of(name)
        if part not in INNER_RANKS:
            continue
        rank = {inner: r for r, inners in enumerate(INNER_RANKS[part]) for inner in inners}
        source = inner_part(name, packages)
        for line, module in imported_modules(path, root, set(modules)):
            target = inner_part(module, packages)
            if part_of(module) != part or source is None or target is None or target == source:
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            if source not in rank or target not in rank:
                problems.append(f"{where}: {part}.{source if source not in rank else target} has no inner rank")
            elif rank[target] > rank[source]:
                problems.append(f"{where}: {part}.{source or '*'} imports {module} (a higher inner rank)")
    return problems


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (node -> the nodes it points to), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def import_cycles(root: Path = PACKAGE) -> list[list[str]]:
    """The modules of the package at ``root`` that import one another in a circle, one sorted list per cycle."""
    modules = package_modules(root)
    graph = {
        name: {module for _, module in imported_modules(path, root, set(modules)) if module in modules} - {name}
        for name, path in modules.items()
    }
    return sorted(component for component in strongly_connected(graph) if len(component) > 1)


def test_no_module_imports_a_higher_rank():
    assert upward_imports() == []


def test_no_module_imports_a_higher_sub_package_of_its_part():
    assert inner_upward_imports() == []


def test_no_modules_import_each_other_in_a_circle():
    assert import_cycles() == []


def test_every_module_and_package_name_is_unique_in_the_package():
    names = Counter(path.parent.name if path.name == "__init__.py" else path.stem for path in PACKAGE.rglob("*.py"))
    assert sorted(name for name, count in names.items() if count > 1) == []


def test_the_inner_check_names_an_import_of_a_higher_sub_package(tmp_path):
    root = tmp_path / "reasonrl"
    for package in ("training", "training/record", "training/update", "training/placement", "rollout", "rollout/gpu"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "training" / "record" / "checkpoint.py").write_text("from reasonrl.training.placement import parallel\n")
    (root / "training" / "placement" / "parallel.py").write_text("from reasonrl.training.record import checkpoint\n")
    (root / "training" / "update" / "step.py").write_text("def f():\n    from reasonrl.training import loop\n")
    (root / "training" / "loop.py").write_text("from reasonrl.training.update import step\n")
    (root / "rollout" / "gpu" / "paged.py").write_text("from reasonrl.rollout.engine_protocol import Completion\n")
    assert inner_upward_imports(root) == [
        "reasonrl/rollout/gpu/paged.py:1: rollout.gpu has no inner rank",
        "reasonrl/training/placement/parallel.py:1: training.placement imports reasonrl.training.record.checkpoint "
        "(a higher inner rank)",
        "reasonrl/training/update/step.py:2: training.update imports reasonrl.training.loop (a higher inner rank)",
    ]


def test_the_check_names_an_upward_import_inside_a_function(tmp_path):
    root = tmp_path / "reasonrl"
    (root / "models").mkdir(parents=True)
    (root / "models" / "value.py").write_text(
        "from reasonrl.algo.masked import masked_mean\n\n\ndef f():\n    from reasonrl.training.policy import g\n"
    )
    (root / "data").mkdir()
    (root / "data" / "select.py").write_text("from ..training import loop\nfrom .examples import Example\n")
    (root / "reward").mkdir()
    (root / "reward" / "prm.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import reasonrl.rollout\n"
    )
    (root / "widgets.py").write_text("import reasonrl.algo\n")
    assert upward_imports(root) == [
        "reasonrl/data/select.py:1: data (rank 2) imports reasonrl.training (rank 6)",
        "reasonrl/models/value.py:5: models (rank 3) imports reasonrl.training.policy (rank 6)",
        "reasonrl/reward/prm.py:3: reward (rank 4) imports reasonrl.rollout (rank 5)",
        "reasonrl/widgets.py:1: reasonrl.widgets has no rank",
    ]


def test_the_cycle_finder_names_each_circle_and_nothing_else(tmp_path):
    root = tmp_path / "reasonrl"
    (root / "data").mkdir(parents=True)
    (root / "data" / "__init__.py").write_text("from reasonrl.data.loaders import load\n")  # a package's face
    (root / "data" / "loaders.py").write_text("def load():\n    from reasonrl.data import preferences\n")
    (root / "data" / "preferences.py").write_text("from .loaders import DataError\n")  # a circle, one import lazy
    (root / "data" / "examples.py").write_text("from reasonrl.data.loaders import load\n")  # into it, not in it
    (root / "training").mkdir()
    (root / "training" / "a.py").write_text("from reasonrl.training.b import x\n")
    (root / "training" / "b.py").write_text("from reasonrl.training import c\n")
    (root / "training" / "c.py").write_text("import reasonrl.training.a\nimport reasonrl.training.c\n")  # and itself
    assert import_cycles(root) == [
        ["reasonrl.data.loaders", "reasonrl.data.preferences"],
        ["reasonrl.training.a", "reasonrl.training.b", "reasonrl.training.c"],
    ]
