"""The compatibility layer has an end: every path of the legacy table (:data:`relaylens.MOVED`, module paths of the
flat layout; :data:`relaylens.MOVED_NAMES`, names a stage face re-exported from the module it replaced) imports
with a ``DeprecationWarning`` that names the new home and the removal version, the stage faces export only their
own contract, and relaylens's own code, tests, docs and notebooks use no legacy path."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import relaylens

ROOT = Path(__file__).resolve().parents[1]
REMOVAL = f"removed in relaylens {relaylens.REMOVED_IN}"
MOVED_NAMES = sorted((face, home, old, new) for face in relaylens.MOVED_NAMES
                     for old, (home, new) in relaylens.legacy_names(face).items())
# The files that define or test the legacy table itself.
TABLE_FILES = {"relaylens/__init__.py", "tests/test_legacy.py", "tests/test_architecture.py",
               "tests/test_contracts.py"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_legacy_table_has_a_removal_version_still_ahead():
    assert _version(relaylens.__version__) < _version(relaylens.REMOVED_IN), (
        f"relaylens {relaylens.__version__} has reached the removal version {relaylens.REMOVED_IN} of the legacy "
        "table. Fix: delete MOVED, MOVED_NAMES, moved_name and the alias finder from relaylens/__init__.py, the "
        "stage faces' __getattr__ hooks and this file's alias tests, and say so in CHANGELOG.md")
    assert f"relaylens {relaylens.REMOVED_IN}" in (ROOT / "CHANGELOG.md").read_text(), \
        "CHANGELOG.md must announce the removal version of the legacy paths"


@pytest.mark.parametrize("old", sorted(relaylens.MOVED))
def test_every_old_module_path_warns_with_its_home_and_removal_version(old):
    sys.modules.pop(f"relaylens.{old}", None)  # import it afresh so the warning fires
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module(f"relaylens.{old}")
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    home = f"relaylens.{relaylens.MOVED[old][0]}"
    assert any(f"relaylens.{old} moved to {home}" in m and REMOVAL in m for m in messages), messages


@pytest.mark.parametrize("face, home, old, new", MOVED_NAMES)
def test_every_moved_name_of_a_face_warns_and_is_the_object_of_its_home(face, home, old, new):
    module = importlib.import_module(f"relaylens.{face}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(module, old)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    home = f"relaylens.{home}" if home else "relaylens"
    assert [m for m in messages if f"relaylens.{face}.{old} moved to {home}.{new}" in m and REMOVAL in m
            ] == messages and len(messages) == 1, messages  # one warning: the home serves the name itself
    assert value is vars(importlib.import_module(home))[new]


@pytest.mark.parametrize("face", sorted(relaylens.MOVED_NAMES))
def test_a_face_exports_its_contract_and_no_moved_name(face):
    """A moved name the face still held would be served silently, without the warning."""
    module = importlib.import_module(f"relaylens.{face}")
    moved = set(relaylens.legacy_names(face))
    exported = set(getattr(module, "__all__", ()))
    assert not moved & exported, f"relaylens.{face}.__all__ lists moved names {moved & exported}"
    assert not moved & set(vars(module)), f"relaylens.{face} defines moved names {moved & set(vars(module))}"
    with pytest.raises(AttributeError, match=f"module 'relaylens.{face}' has no attribute 'nothing_here'"):
        getattr(module, "nothing_here")


def test_the_warning_points_at_the_importing_line():
    code = "import warnings; warnings.simplefilter('always')\nfrom relaylens.results import load_run\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert ("<string>:2: DeprecationWarning: relaylens.results.load_run moved to relaylens.results.store.load_run"
            in out.stderr), out.stderr


def _python_sources() -> dict[str, str]:
    files = sorted((ROOT / "relaylens").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    files += sorted((ROOT / "docs" / "hooks").glob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text() for p in files}


def _code_blocks() -> dict[str, str]:
    """The Python of the notebooks (code cells) and of the Markdown pages (fenced ``python`` blocks)."""
    out = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        out[str(path.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for path in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]:
        blocks = re.findall(r"```(?:python|py|pycon)\n(.*?)```", path.read_text(), re.S)
        out[str(path.relative_to(ROOT))] = "\n".join(blocks)
    return out


IMPORT = re.compile(r"^\s*(?:>>>\s*)?(?:from\s+(relaylens[\w.]*)\s+import\s+(?:\(([\w\s,]+)\)|([\w ,]+))"
                    r"|import\s+(relaylens[\w.]*))", re.M)


def legacy_uses(text: str) -> list[str]:
    """The legacy paths ``text`` imports (module paths and moved names, also in docstring examples) or spells out
    (``relaylens.geometry.rotate_keys``)."""
    found = []
    for match in IMPORT.finditer(text):
        module = match.group(1) or match.group(4)
        names = [n.split(" as ")[0].strip() for n in (match.group(2) or match.group(3) or "").split(",") if n.strip()]
        if relaylens.moved_home(module):
            found.append(module)
            continue
        found += [f"{module}.{n}" for n in names
                  if relaylens.moved_home(f"{module}.{n}") or n in _moved_names(module.partition(".")[2])]
    for dotted in re.findall(r"\brelaylens\.(\w+)\.(\w+)", text):
        if dotted[1] in _moved_names(dotted[0]):
            found.append("relaylens." + ".".join(dotted))
    return found


def _moved_names(face: str) -> set[str]:
    return set(relaylens.legacy_names(face))


def test_the_legacy_check_finds_each_kind_of_use():
    text = ("from relaylens.rows import run_rows\nimport relaylens.figures.registry\n"
            "from relaylens import scopes\n>>> from relaylens.geometry import (Selection,\n    rotate_keys)\n"
            "see relaylens.results.load_run\n")
    assert legacy_uses(text) == ["relaylens.rows", "relaylens.figures.registry", "relaylens.scopes",
                                 "relaylens.geometry.rotate_keys", "relaylens.results.load_run"]
    assert legacy_uses("from relaylens.geometry import Selection\nfrom relaylens.geometry import rotary\n") == []


def test_own_code_tests_docs_and_notebooks_use_no_legacy_path():
    problems = [f"{name}: {use}" for name, text in {**_python_sources(), **_code_blocks()}.items()
                if name not in TABLE_FILES for use in legacy_uses(text)]
    assert not problems, ("legacy paths in use (import from the new home named in the warning):\n"
                          + "\n".join(problems))


# Modules that docs and notebooks import by their own path, each with its reason; everything else comes from
# ``relaylens`` (the public face), a stage face ``relaylens.<stage>``, or a root module (``relaylens.testing``).
OWN_DOOR = {
    "relaylens.integrations.kvpress_relay": "self-contained: runs in kvpress's own pinned environment",
    "relaylens.integrations.lm_eval": "registers lm-eval's model type when imported; needs the lmeval extra",
    "relaylens.integrations.tl_export": "imported on its own (TransformerLens export), never from the face",
    "relaylens.probes.transformer_lens": "the TransformerLens backend (bridge_model), used beside tl_export",
    "relaylens.model.embedded": "is_pulled: relaylens.model exports nothing yet (its room is closed in issue 42)",
}


def test_docs_and_notebooks_import_from_the_public_face_or_a_stage_face():
    stages = {p.parent.name for p in (ROOT / "relaylens").glob("*/__init__.py")}
    roots = {p.stem for p in (ROOT / "relaylens").glob("*.py")}
    problems = []
    for name, text in _code_blocks().items():
        for match in IMPORT.finditer(text):
            module = match.group(1) or match.group(4)
            parts = module.split(".")
            if len(parts) == 1 or (len(parts) == 2 and parts[1] in stages | roots) or module in OWN_DOOR:
                continue
            problems.append(f"{name}: {module} (import from relaylens or relaylens.{parts[1]})")
    assert not problems, "\n".join(problems)


def test_the_scans_read_every_notebook_and_page():
    blocks = _code_blocks()
    notebooks = {str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks and notebooks <= set(blocks)
    assert "from relaylens import" in blocks["README.md"] and "from relaylens" in blocks["docs/how-to/extend.md"]
