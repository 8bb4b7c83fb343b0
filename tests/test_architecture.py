"""The package's shape: no import circle (in-function imports included), the reporting wing is a staircase, no
private name crosses a file boundary anywhere in the package, modules stay small, and no test module imports
another."""

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


def test_no_import_circle():
    """Every import edge between relaylens modules (module-level or inside a function) forms no cycle. A
    submodule's implicit import of its own parent package is not an edge (``relaylens/__init__`` is lazy)."""
    graph = {name: _targets(path) - _parents(name) for name, path in MODULES.items()}
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


def _private_uses(path: Path) -> list[str]:
    """Private names of other relaylens modules that ``path`` uses: imported by name (``from relaylens.x import
    _y``), or read as an attribute of an imported relaylens module (``x._y``)."""
    problems, aliases = [], {}
    for module, imported, line in _imports(path):
        target = f"{module}.{imported}" if imported and f"{module}.{imported}" in MODULES else module
        if imported and imported.startswith("_") and not imported.startswith("__") and module.startswith("relaylens"):
            problems.append(f"{path.name}:{line} imports private {module}.{imported}")
        if target in MODULES:
            aliases[(imported or module).split(".")[0]] = target
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            problems.append(f"{path.name}:{node.lineno} reads private {aliases[node.value.id]}.{node.attr}")
    return problems


def _private_members() -> dict[str, str]:
    """Private methods and class attributes defined in relaylens classes: name -> defining module."""
    out = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    member = getattr(item, "name", None) or (item.targets[0].id if isinstance(item, ast.Assign) and
                                                             isinstance(item.targets[0], ast.Name) else None)
                    if member and member.startswith("_") and not member.startswith("__"):
                        out[member] = name
    return out


def test_wing_is_a_staircase_of_public_names():
    """Wing modules import only wing rooms below them (or their own room)."""
    problems = []
    for name, path in MODULES.items():
        room = _wing_room(name)
        if room is None:
            continue
        for module, imported, line in _imports(path):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in MODULES else module
            other = _wing_room(target)
            if other is not None and WING.index(other) > WING.index(room):
                problems.append(f"{path.name}:{line} imports {target}, a room above {room}")
    assert not problems, "\n".join(problems)


def test_no_private_name_crosses_a_file_boundary():
    """Package-wide: no module imports or reads another module's private name, calls a private method of a class
    defined in another module (``store._load_unit``), or touches Hugging Face's private attention-kernel field
    outside the Hugging Face room (``relaylens/hf.py``)."""
    members = _private_members()
    problems = []
    for name, path in MODULES.items():
        problems += _private_uses(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                continue
            if members.get(node.attr, name) != name:
                problems.append(f"{path.name}:{node.lineno} uses {node.attr}, private to {members[node.attr]}")
            if node.attr == "_attn_implementation" and name != "relaylens.model.hf":
                problems.append(f"{path.name}:{node.lineno} touches _attn_implementation; use relaylens.model.hf's "
                                "attention_kernel / attention_kernel_name")
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
