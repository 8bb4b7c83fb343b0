"""The package's shape: no import circle, the reporting wing's rooms use only public names of the rooms below them,
modules stay small, and no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relaylens"
WING = ["tables", "summaries", "plots", "figures", "report"]  # the reporting wing, bottom to top
MAX_WING_LINES = 310


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "analyses" in path.relative_to(PACKAGE).parts:  # the analyses folder, linked in: specs, not library code
            continue
        found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for every import in the file, at any depth (also inside functions)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [(base, alias.name, node.lineno) for alias in node.names]
    return out


def _targets(path: Path) -> set[str]:
    """The relaylens modules a file imports (``from pkg import submodule`` counts as the submodule)."""
    out = set()
    for module, name, _ in _imports(path):
        if name and f"{module}.{name}" in MODULES:
            out.add(f"{module}.{name}")
        elif module in MODULES:
            out.add(module)
    return out - {_module_name(path)}


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))}


# Known circle, left open on purpose until its owner untangles it: conditions.get_condition imports relaylens.scopes
# inside the function to parse "relay@layers=..." specs, and scopes builds on the condition classes.
# in-function imports still to open: get_condition parses scopes; run_condition (one row) delegates to run_rows
KNOWN_CIRCLE_EDGES = {("relaylens.conditions", "relaylens.scopes"), ("relaylens.generation", "relaylens.rows")}


def test_no_import_circle():
    """Every import edge between relaylens modules (module-level or inside a function) forms no cycle. A
    submodule's implicit import of its own parent package is not an edge (``relaylens/__init__`` is lazy)."""
    graph = {name: _targets(path) - _parents(name) for name, path in MODULES.items()}
    for a, b in KNOWN_CIRCLE_EDGES:
        assert b in graph[a], f"{a} no longer imports {b}: drop the edge from KNOWN_CIRCLE_EDGES"
        graph[a] = graph[a] - {b}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def _wing_room(name: str) -> str | None:
    for room in WING:
        if name == f"relaylens.{room}" or name.startswith(f"relaylens.{room}."):
            return room
    return None


def test_wing_is_a_staircase_of_public_names():
    """Wing modules import only wing rooms below them (or their own room), and never a private name of another
    file; attribute access on an imported relaylens module never reads a private name either."""
    problems = []
    for name, path in MODULES.items():
        room = _wing_room(name)
        if room is None:
            continue
        aliases = {}
        for module, imported, line in _imports(path):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in MODULES else module
            other = _wing_room(target)
            if other is not None and WING.index(other) > WING.index(room):
                problems.append(f"{path.name}:{line} imports {target}, a room above {room}")
            if imported and imported.startswith("_") and not imported.startswith("__") and module.startswith("relaylens"):
                problems.append(f"{path.name}:{line} imports private {module}.{imported}")
            if target in MODULES:
                aliases[imported or module] = target
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                problems.append(f"{path.name}:{node.lineno} reads private {aliases[node.value.id]}.{node.attr}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _wing_room(n)))
def test_wing_modules_are_small(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_WING_LINES, f"{name} has {lines} lines; split it (one figure / one job per file)"


def test_no_test_module_imports_another():
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    offenders = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        text = path.read_text()
        for module, imported, line in _imports(path):
            if module.split(".")[0] in tests | {"conftest"} or (module == "" and imported in tests):
                offenders.append(f"{path.name}:{line} imports {module or imported}")
        for stem in tests:  # also inside code strings run by subprocesses
            if f"from {stem} import" in text or f"import {stem}\n" in text:
                offenders.append(f"{path.name} mentions an import of {stem}")
    assert not offenders, "\n".join(offenders)


def test_nothing_imports_a_top_level_analyses_package():
    """relaylens reaches the analyses only as relaylens.analyses (issue 14: a foreign ``analyses`` must never load)."""
    offenders = [f"{path.name}:{line}" for path in MODULES.values() for module, _, line in _imports(path)
                 if module == "analyses" or module.startswith("analyses.")]
    text = "\n".join(p.read_text() for p in MODULES.values())
    assert not offenders and "import_module(f\"analyses" not in text and "import_module(\"analyses" not in text, offenders
