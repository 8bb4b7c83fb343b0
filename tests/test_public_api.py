"""The public face: every documented name imports from ``relaylens`` itself, is the object of its home module,
loads lazily (``import relaylens`` pulls in no torch), and the README's Python example uses only these names."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import relaylens

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = ("load_model", "load_records", "render_prompt", "prefill_history", "make_selector", "get_condition",
              "run_condition", "probe_condition", "load_tables", "write_report", "write_figures", "Selection",
              "RotaryFactors", "relocate_keys", "ExperimentSpec", "run_analysis", "example_tables", "RelaylensError")


def test_issue_names_are_public():
    assert set(DOCUMENTED) <= set(relaylens.__all__)


@pytest.mark.parametrize("name", sorted(relaylens.__all__))
def test_from_relaylens_import(name):
    namespace: dict = {}
    exec(f"from relaylens import {name}", namespace)
    home = relaylens._EXPORTS[name]
    assert namespace[name] is getattr(importlib.import_module(home), name)
    assert name in relaylens.__doc__, f"{name} is exported but not listed in relaylens/__init__.py's docstring"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        relaylens.nothing_here  # noqa: B018
    with pytest.raises(ImportError):
        exec("from relaylens import nothing_here", {})


def test_import_is_light():
    code = ("import sys, relaylens; bad = [m for m in ('torch', 'transformers', 'pandas') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_readme_python_example_uses_the_public_face():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Python\s+```python\n(.*?)```", readme, re.S)
    assert block, "README has no '## Python' example"
    imports = [node for node in ast.walk(ast.parse(block.group(1))) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports and all(isinstance(n, ast.ImportFrom) and n.module == "relaylens" for n in imports)
    names = {alias.name for n in imports for alias in n.names}
    assert names <= set(relaylens.__all__), names - set(relaylens.__all__)


@pytest.mark.parametrize("module", sorted(set(relaylens._EXPORTS.values())))
def test_every_public_module_has_a_running_example(module):
    """``--doctest-modules`` runs the examples; this checks each public module has at least one that is not skipped."""
    import doctest

    mod = importlib.import_module(module)
    examples = [ex for test in doctest.DocTestFinder().find(mod) if test.name.startswith(module)
                for ex in test.examples if not ex.options.get(doctest.SKIP)]
    assert examples, f"{module} has no runnable docstring example"
