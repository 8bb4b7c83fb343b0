"""The runner's fan-out stays small: ``relaylens/experiments/runner.py`` imports at most 18 distinct relaylens modules
(in-function imports counted too; issue 42 measured 29 before the probe registry and the run recipe)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "relaylens" / "experiments" / "runner.py"
MAX_MODULES = 18


def relaylens_modules(source: str) -> set[str]:
    """The distinct relaylens modules ``source`` imports anywhere (``from relaylens.x import y`` counts as
    ``relaylens.x.y`` when that is a module of the package, else as ``relaylens.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "relaylens"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "relaylens":
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if _is_module(child) else node.module)
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_runner_imports_few_relaylens_modules():
    modules = relaylens_modules(RUNNER.read_text())
    assert len(modules) <= MAX_MODULES, (f"relaylens/experiments/runner.py imports {len(modules)} relaylens modules "
                                         f"(at most {MAX_MODULES}): {sorted(modules)}. Fix: give the new work its own "
                                         "module (a probe kind: relaylens/probes/registry.py) and call it from there")


def test_the_count_sees_in_function_imports_and_submodules():
    source = ("import relaylens.errors\nfrom relaylens.probes import readouts\nfrom relaylens.datasets import SAMPLE\n"
              "def f():\n    from relaylens.results.store import UnitKey\n    import json\n")
    assert relaylens_modules(source) == {"relaylens.errors", "relaylens.probes.readouts", "relaylens.datasets",
                                         "relaylens.results.store"}
