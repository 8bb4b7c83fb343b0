"""Docs and contracts as one fact: each stage face's "May import" line names exactly the rooms of the allowed-imports
table that tests/test_architecture.py enforces, and every dotted ``relaylens.x.y`` path written in the package, the
docs, the README and the notebooks imports without the legacy table and names its object's home (or a face that
exports it)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest

import relaylens

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.parent.name for p in (ROOT / "relaylens").glob("*/__init__.py") if p.parent.name != "analyses")


def _allowed() -> dict[str, set[str]]:
    """The allowed-imports table, read from tests/test_architecture.py (its one definition)."""
    spec = importlib.util.spec_from_file_location("architecture_table", ROOT / "tests" / "test_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALLOWED


ALLOWED = _allowed()


def may_import(doc: str) -> set[str]:
    """The rooms a contract docstring's "May import:" line names in its first clause (up to the first ``;`` or full
    stop, parenthesised remarks left out): each ``:mod:`relaylens.X``` and each room named as a bare word."""
    match = re.search(r"May import:(.*)", doc, re.S)
    assert match, "no 'May import:' line"
    text = match.group(1)
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    clause = re.split(r";|\.(?:\s|$)", text, maxsplit=1)[0]
    refs = re.findall(r":mod:`~?(relaylens(?:\.\w+)+)`", clause)
    words = re.findall(r"\w+", re.sub(r":mod:`[^`]*`", "", clause))
    return {ref.split(".")[1] for ref in refs} | {word for word in words if word in ALLOWED}


def test_may_import_reads_the_first_clause_only():
    doc = ("May import: :mod:`relaylens.errors`, scoring and :mod:`relaylens.model` (read through "
           ":mod:`relaylens.probes`); never :mod:`relaylens.generation` or results.")
    assert may_import(doc) == {"errors", "model", "scoring"}


@pytest.mark.parametrize("stage", STAGES)
def test_may_import_line_equals_the_allowed_imports_table(stage):
    doc = ast.get_docstring(ast.parse((ROOT / "relaylens" / stage / "__init__.py").read_text())) or ""
    assert stage in ALLOWED, f"relaylens/{stage} is not a room of ALLOWED in tests/test_architecture.py"
    named, allowed = may_import(doc), ALLOWED[stage]
    assert named == allowed, (
        f"relaylens/{stage}/__init__.py says 'May import:' {sorted(named)}, the architecture test allows "
        f"{sorted(allowed)}. Fix: name exactly the allowed rooms (as :mod:`relaylens.X` or bare room names) in the "
        f"line's first clause (missing {sorted(allowed - named)}, extra {sorted(named - allowed)}), or change ALLOWED "
        "with its reason")


def test_every_dataset_format_is_named_by_the_datasets_contract():
    from relaylens.datasets import FORMATS

    doc = re.sub(r"[^a-z]", "", (relaylens.datasets.__doc__ or "").split("\n\n")[0].lower())
    assert [name for name in FORMATS if name not in doc] == []


# Dotted paths written on purpose that do not resolve: placeholders, and legacy paths named to explain the legacy
# table (relaylens/__init__.py, the table itself, is not scanned).
PLACEHOLDERS = {"NAME", "ANALYSIS", "x", "Y"}
LEGACY_MENTIONS = {
    ("docs/getting-started.md", "relaylens.rows"), ("docs/getting-started.md", "relaylens.scopes"),
}
DOTTED = re.compile(r"(?<![\w/.])relaylens(?:\.[A-Za-z_]\w*)+")
# entry-point group names (relaylens.figures, relaylens.benchmarks, ...) look like module paths but name the groups
# other packages register plugins under: each is the ENTRY_POINT_GROUP of a registry module
ENTRY_POINT_GROUPS = {m.group(1) for p in sorted((ROOT / "relaylens").rglob("*.py"))
                      for m in re.finditer(r'^ENTRY_POINT_GROUP\s*=\s*"([\w.]+)"', p.read_text(encoding="utf-8"), re.M)}


def _sources() -> list[Path]:
    files = [p for p in sorted((ROOT / "relaylens").rglob("*.py")) if p != ROOT / "relaylens" / "__init__.py"]
    files += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "docs" / "hooks").glob("*.py"))
    return files + [ROOT / "README.md"] + sorted((ROOT / "notebooks").glob("*.ipynb"))


def dotted_paths() -> dict[str, set[str]]:
    """Every ``relaylens.x.y`` written in the package, the docs, the README and the notebooks -> the files."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        text = path.read_text()
        for match in DOTTED.finditer(text):
            start, end = match.span()
            if start and text[start - 1] in "'\"" and text[end:end + 1] == text[start - 1]:
                continue  # a string that is a dotted name alone is a key or a logger name, not a module path
            found.setdefault(match.group(0), set()).add(str(path.relative_to(ROOT)))
    return found


def problem(path: str) -> str | None:
    """Why ``path`` is stale (None: it imports, without the legacy table, and names its object's home or a face
    that exports it)."""
    parts = path.split(".")
    for k in range(len(parts), 1, -1):  # a split module's old path moves only as a whole: its prefix is checked
        home = relaylens.moved_home(".".join(parts[:k]))
        if home:
            return f"a legacy path (moved to {' + '.join(home)})"
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[i:]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                if not hasattr(obj, attr):
                    return f"{module} has no {'.'.join(parts[i:])}"
                obj = getattr(obj, attr)
        if len(parts) == i + 1 and (inspect.isclass(obj) or inspect.isfunction(obj)):
            home = obj.__module__
            if home != module and parts[i] not in getattr(sys.modules[module], "__all__", ()):
                return f"{parts[i]} lives in {home}"
        return None
    return "no such module"


def test_the_path_check_finds_each_kind_of_stale_path():
    assert problem("relaylens.geometry.rotary.RotaryFactors") is None
    assert problem("relaylens.geometry.RotaryFactors") is None  # a face that exports it
    assert problem("relaylens.figures.registry") == "a legacy path (moved to relaylens.reporting.figures.registry)"
    stale = "relaylens.generation.single.GenerationResult"  # importable there, but its home is rows
    assert problem(stale) == "GenerationResult lives in relaylens.generation.rows"
    assert problem("relaylens.geometry.rotate_keys") == "rotate_keys lives in relaylens.geometry.rotary"
    assert problem("relaylens.reporting.summaries.bands") == "relaylens.reporting.summaries has no bands"
    assert problem("relaylens.nothing") == "relaylens has no nothing"
    assert problem("relaylens.runner.make_judge").startswith("a legacy path (moved to relaylens.experiments.runner + ")


def test_every_dotted_path_in_code_docs_and_notebooks_imports_and_names_its_home():
    problems = []
    for path, files in sorted(dotted_paths().items()):
        if PLACEHOLDERS & set(path.split(".")) or path in ENTRY_POINT_GROUPS:
            continue
        where = sorted(f for f in files if (f, path) not in LEGACY_MENTIONS)
        why = problem(path) if where else None
        if why:
            problems.append(f"{path} ({', '.join(where)}): {why}")
    assert not problems, "stale module paths:\n" + "\n".join(problems)
