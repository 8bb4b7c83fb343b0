"""The package's shape, enforced: one subpackage per stage with a contract docstring, a declared folder-to-folder
import graph (in-function imports included), a torch-free wall, Hugging Face internals in one room, no import circle,
the reporting wing as a staircase, no private name crossing a file boundary, every ``__all__`` resolving, every old
module path importing through the alias table, and no test module importing another."""

from __future__ import annotations

import ast
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
PACKAGE = ROOT / "relaylens"

# The folder graph: room -> the rooms it may import (a DAG; ``errors`` and ``progress`` are leaves every room may
# use where listed). Rooms are the stage subpackages and the root modules. Reasons for the edges that are not obvious:
# * datasets -> scoring: a record whose reference answer normalises to nothing is refused while loading
#   (scoring.metrics.normalize_answer; scoring itself imports no stage).
# * geometry -> model: rotary factors are read from the loaded model through model.hf.
# * conditions -> geometry: only inside functions (Selection's padding value); importing conditions imports no torch.
# * probes -> results: the probes table's metric names (results.tables, torch-free).
# * reporting -> scoring / conditions: judge agreement statistics; condition labels and layer bands.
# * model / results -> fileio: the model cache and the run store write and lock files through one implementation
#   (atomic writes, lock files that never follow a link); fileio itself imports only errors.
# * scoring -> fileio: the judge's verdict cache is read and appended without following a link (issue 52).
# * datasets / scoring -> model: text that is data (a record's, a candidate answer's) is tokenised with one helper,
#   model.tokens.encode_data_text (torch-free), by the prompt renderer and by the local judge; the real benchmark
#   files come with the embedded models' downloader and cache root (datasets.real_data, inside functions).
# * registry: the one registry idiom (name -> object, lazy references, entry-point plugins) of every extension point;
#   standard library and errors only, so every stage that owns a registry may use it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "progress": set(),
    "registry": {"errors"},
    "fileio": {"errors"},
    "scoring": {"errors", "fileio", "model"},
    "datasets": {"errors", "scoring", "model", "registry"},
    "model": {"errors", "fileio"},
    "geometry": {"errors", "model"},
    "conditions": {"errors", "geometry", "registry"},
    "selectors": {"errors", "datasets", "model", "geometry", "registry"},
    "generation": {"errors", "model", "geometry", "conditions"},
    "probes": {"errors", "model", "geometry", "conditions", "generation", "results", "registry"},
    "results": {"errors", "fileio"},
    "reporting": {"errors", "results", "scoring", "conditions", "registry"},
    "experiments": {"errors", "progress", "registry", "datasets", "model", "geometry", "conditions", "selectors",
                    "generation", "probes", "scoring", "results", "reporting"},
    # integrations sit on the top floor beside experiments: generate() and lm-eval over the stages below; the
    # TransformerLens / CircuitsVis export over the probes' TransformerLens backend
    "integrations": {"errors", "datasets", "model", "geometry", "conditions", "selectors", "generation", "probes"},
    # bench sits above experiments (as the experiments docstring says): bench dtype times records as `relaylens run`
    # runs them, through the runner itself
    "bench": {"errors", "progress", "datasets", "model", "geometry", "conditions", "selectors", "generation", "probes",
              "scoring", "results", "reporting", "experiments", "registry"},
    "testing": {"errors", "model", "probes"},  # test support (tiny models); no package module imports it
    "cli": {"errors", "progress", "datasets", "model", "geometry", "conditions", "selectors", "generation", "probes",
            "scoring", "results", "reporting", "experiments", "bench"},
    "__init__": set(),  # the lazy public face names its homes as strings, never imports them at module level
}
# Single edges outside the graph, each with its reason.
EXCEPTIONS = {
    # FINCH's selection is defined by one question pass over the full cache, which is generation's job; generation
    # never imports selectors, so this one in-function edge closes no circle.
    ("relaylens.selectors.finch", "generation"),
    # The real benchmark files (LongMemEval oracle, LoCoMo) are cached with the shared atomic write and lock
    # (fileio); fileio imports no datasets module, so this in-function edge closes no circle.
    ("relaylens.datasets.real_data", "fileio"),
}
TORCH_FREE = ("conditions", "results", "reporting", "scoring", "datasets")  # importing them imports no torch
PANDAS_FREE = ("conditions",)
WING = ["bootstrap", "retention", "overhead", "crossrun", "summaries", "htmlsafe", "plots", "figures", "token_view",
        "report"]  # reporting, bottom to top: each imports only rooms below it
MAX_ROOT_MODULES = 6
# Hugging Face internals (implementation details of its modules and caches): a regular expression over code -> the
# relaylens.model.hf function to use instead. Public API stays usable anywhere: ``model(...)``, ``model.config`` and
# its fields (a config's ``sliding_window`` too), ``generate``, ``get_input_embeddings``, ``cache.get_seq_length()``,
# the Auto* and *Config classes.
HF_INTERNALS = {
    r"\b(Dynamic|Static|Hybrid|Offloaded|Quantized)\w*Cache\b":
        "construct caches with relaylens.model.hf.new_cache / cache_from_tensors",
    r"\.model\.model\b": "reach decoder layers with relaylens.model.hf.decoder_layers",
    r"\.self_attn\b": "reach attention modules with relaylens.model.hf.layer_attention / attention_modules",
    r"\._attn_implementation\b": "use relaylens.model.hf.attention_kernel / attention_kernel_name",
    r"\bcache\.layers\b|\.(crop|batch_select_indices)\(":
        "read or change a cache's layers with relaylens.model.hf.cache_data / cached_keys / crop_cache / "
        "select_cache_rows",
    r"\bmodel\.norm\b|\.variance_epsilon\b|\.(input|post_attention)_layernorm\b|__name__\.endswith\([\"']RMSNorm":
        "reach norms with relaylens.model.hf.final_norm / rms_norm_gain / rms_norms",
    r"\.layer_idx\b": "ask relaylens.model.hf.attention_layer_index",
    r"(?<!config)\.sliding_window\b": "ask relaylens.model.hf.attention_window (a config's sliding_window is public)",
    r"\.[qkvo]_proj\b": "use relaylens.model.hf.query_key_projections / output_projection",
    r"\.rope_type\b": "read rope types with relaylens.model.hf.rotary_types",
    r"\bAttentionInterface\b|\bALL_ATTENTION_FUNCTIONS\b":
        "use relaylens.model.hf.register_attention_function / preserved_attention_functions",
    r"\.(lm_head|embed_tokens)\b": "use the public model.get_output_embeddings() / get_input_embeddings()",
    r"\btransformers\.(models|modeling_utils|masking_utils|cache_utils|integrations)\b":
        "import transformers' top-level names only; its modules' internals belong in relaylens.model.hf",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "analyses" in path.relative_to(PACKAGE).parts:  # relaylens/analyses/: specs, not library code
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


def room(name: str) -> str:
    """The room of a module: its stage subpackage, or the root module itself (``relaylens`` -> ``__init__``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def folder_edges(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """``(module, its room, imported room)`` for every import that crosses rooms."""
    out = []
    for name, path in modules.items():
        for target in sorted(_targets(path) - _parents(name)):
            if room(target) != room(name):
                out.append((name, room(name), room(target)))
    return out


def graph_violations(modules: dict[str, Path]) -> list[str]:
    return [f"{name} ({src}) imports {dst}: not in ALLOWED[{src!r}]" for name, src, dst in folder_edges(modules)
            if dst not in ALLOWED.get(src, set()) and (name, dst) not in EXCEPTIONS]


def test_rooms_are_declared_and_the_graph_is_a_dag():
    rooms = {room(name) for name in MODULES}
    assert rooms == set(ALLOWED), f"undeclared rooms {rooms - set(ALLOWED)}, gone {set(ALLOWED) - rooms}"
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(ALLOWED[node]):
            assert state.get(nxt) != 1, "the declared graph has a circle: " + " -> ".join(stack + [node, nxt])
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for node in sorted(ALLOWED):
        if node not in state:
            visit(node, [])


def test_every_import_follows_the_folder_graph():
    """Every import between rooms (module level or inside a function) is an edge of :data:`ALLOWED`."""
    problems = graph_violations(MODULES)
    assert not problems, "\n".join(problems)


def test_the_folder_graph_check_catches_a_forbidden_edge(tmp_path):
    """The check itself: a geometry module importing generation (inside a function) is reported."""
    bad = tmp_path / "relaylens" / "geometry" / "leak.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from relaylens.generation.rows import run_rows\n    return run_rows\n")
    modules = dict(MODULES)
    modules["relaylens.geometry.leak"] = bad
    global ROOT
    saved, ROOT = ROOT, tmp_path  # _module_name of the planted file
    try:
        problems = graph_violations({"relaylens.geometry.leak": bad})
    finally:
        ROOT = saved
    assert problems == ["relaylens.geometry.leak (geometry) imports generation: not in ALLOWED['geometry']"]


def test_root_holds_few_modules_and_every_subpackage_states_its_contract():
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if folder.name == "analyses":
            continue
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert "May import" in doc, \
            f"relaylens/{folder.name}/__init__.py: the contract docstring must say what the package may import"
        assert len(doc) > 200, f"relaylens/{folder.name}/__init__.py: state what it owns, takes and gives"


def _import_in_subprocess(packages: tuple[str, ...]) -> dict:
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"for name in {packages!r}:\n"
        "    pkg = importlib.import_module('relaylens.' + name)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'transformers', 'pandas')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_torch_free_packages_import_no_torch():
    loaded = _import_in_subprocess(TORCH_FREE)
    assert not loaded["torch"] and not loaded["transformers"], loaded


def test_conditions_import_no_pandas():
    loaded = _import_in_subprocess(PANDAS_FREE)
    assert not loaded["torch"] and not loaded["pandas"], loaded


# The room of Hugging Face internals: relaylens.model.hf (every question about a loaded model or cache) and the model
# families it looks up where the answer depends on the family (relaylens.model.adapters: query/key recipes, layers
# without rotary); hf imports adapters, adapters imports no other relaylens.model module.
HF_ROOM = {"relaylens.model.hf", "relaylens.model.adapters"}
# Modules outside the room that reach Hugging Face internals themselves, each with its reason.
OWN_HF_ACCESS = {
    # RelayPress runs in kvpress's own pinned environment (its transformers, not relaylens's) and imports no relaylens
    # module (tests/integrations/test_kvpress_relay.py checks both), so it cannot go through relaylens.model.hf
    "relaylens.integrations.kvpress_relay",
}


def hf_leaks(text: str) -> list[tuple[int, str]]:
    """``(line, pattern of HF_INTERNALS)`` for every Hugging Face internal a module's source uses: in code (not in
    strings, comments or docstring examples), and in ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` calls,
    spelled out (``getattr(m, "layer_idx", 0)`` reads ``m.layer_idx``)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.lstrip().startswith((">>>", "...")) or not code.strip():
            continue
        found += [(number, p) for p in HF_INTERNALS if re.search(p, code) and not _in_string(code, p)]
    for node in ast.walk(ast.parse(text)):
        if _is_attribute_call(node):
            found += [(node.lineno, p) for p in HF_INTERNALS if re.search(p, _spelled(node))]
    return found


def test_hugging_face_internals_stay_in_model_hf():
    problems = []
    for name, path in MODULES.items():
        if name in HF_ROOM or name in OWN_HF_ACCESS:
            continue
        problems += [f"{path.relative_to(ROOT)}:{number} uses {pattern!r}: {HF_INTERNALS[pattern]}"
                     for number, pattern in hf_leaks(path.read_text())]
    assert not problems, "\n".join(problems)
    assert _targets(MODULES["relaylens.model.adapters"]) <= {"relaylens.errors"}, "the families sit below hf"


# The leaks closed in issue 42, as they were written (each must be caught if it comes back), and lines that use the
# same names as public API, relaylens's own fields or text (each must pass).
CLOSED_LEAKS = [
    "for layer in batch.cache.layers:\n    layer.crop(-tokens)\n",  # generation.rows: cache surgery
    "layer.batch_select_indices(index.to(layer.keys.device))\n",
    "layers = [(layer.keys, layer.values) for layer in relocated.cache.layers]\n",  # generation.single
    'norm = getattr(getattr(model, "model", model), "norm", None)\n',  # probes.attribution: norm reading
    'eps = getattr(module, "variance_epsilon", None)\n',
    "from transformers import AttentionInterface\n",  # generation.attention: the kernel and what it reads
    "layer = module.layer_idx\n",
    'window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)\n',
    'layer_idx = getattr(module, "layer_idx", index)\n',  # model.attention_stats, bench.checks, probes.transformer_lens
    "raw_types = rotary.rope_type if isinstance(rotary.rope_type, dict) else {}\n",  # geometry.rotary
    'raw_types = {None: getattr(rotary, "rope_type", "default")}\n',
    "attn.q_proj.weight.mul_(sharpen)\n",  # testing.peaked_model
    'norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]\n',  # testing.exact_float64_norms
]
PUBLIC_LOOKALIKES = [
    'window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None\n',
    "types = factors.rope_types\n",
    'message = "expected model.model.layers[i].self_attn; cache.layers holds DynamicCache layers"\n',
    "vocab = model.get_input_embeddings().num_embeddings\n",
    "norm = values.norm(dim=-1)\n",
    '"""Docstring.\n\n    >>> gain, eps = rms_norm_gain(tiny_model("llama").model.norm)\n"""\n',
]


@pytest.mark.parametrize("line", CLOSED_LEAKS)
def test_the_internals_check_catches_each_closed_leak(line):
    assert hf_leaks(line), f"relaylens.model.hf's room check misses {line!r}"


def test_the_internals_check_passes_public_lookalikes():
    assert not {line: hf_leaks(line) for line in PUBLIC_LOOKALIKES if hf_leaks(line)}


def _is_attribute_call(node: ast.AST) -> bool:
    """``getattr(x, "name", ...)`` (or ``hasattr`` / ``setattr`` / ``delattr``) with a literal name."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def _spelled(node: ast.AST) -> str:
    """An expression as attribute reads: ``getattr(getattr(m, "model", m), "norm", None)`` -> ``m.model.norm``."""
    if _is_attribute_call(node):
        return f"{_spelled(node.args[0])}.{node.args[1].value}"
    if isinstance(node, ast.Attribute):
        return f"{_spelled(node.value)}.{node.attr}"
    return ast.unparse(node)


def _in_string(code: str, pattern: str) -> bool:
    """Whether every match of ``pattern`` in the line sits inside a string literal (docs and messages)."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:  # part of a multi-line statement or docstring: only quotes around the match count
        return bool(re.search(r"[\"'`][^\"'`]*(?:" + pattern + ")", code))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return len(re.findall(pattern, code)) == sum(len(re.findall(pattern, s)) for s in strings)


CYCLE_REASON = re.compile(r"^\s*from (relaylens[\w.]*) import .*# noqa: PLC0415 - import cycle\b")


def cycle_reasons() -> list[tuple[str, str]]:
    """``(module, what it imports inside a function)`` for every in-function import whose reason is an import cycle."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out += [(module, m.group(1)) for line in path.read_text().splitlines() if (m := CYCLE_REASON.match(line))]
    return out


def imports_back(module: str, imported: str) -> bool:
    """Whether importing ``imported`` in a fresh interpreter (its packages' faces included, as Python runs them)
    imports ``module``: only then would a module-level import of it from ``module`` close a circle."""
    code = f"import importlib, sys\nimportlib.import_module({imported!r})\nprint({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def test_every_import_cycle_reason_is_true():
    """An in-function import that says "import cycle" is one: the imported module imports this one (issue 53 found
    five that did not; they are module-level imports now)."""
    reasons = cycle_reasons()
    assert reasons, "no in-function import gives an import cycle as its reason: drop this test or the pattern"
    false = [f"{module} -> {imported}" for module, imported in reasons if not imports_back(module, imported)]
    assert not false, ("in-function imports that claim an import cycle, but the imported module does not import "
                       "this one; import it at module level:\n" + "\n".join(false))


def test_the_cycle_check_tells_a_true_reason_from_a_false_one():
    assert imports_back("relaylens.datasets.locomo", "relaylens.datasets.prompting")  # through the datasets face
    assert not imports_back("relaylens.datasets.locomo", "relaylens.errors")


def test_no_import_circle():
    """Every import edge between relaylens modules (module level or inside a function) forms no cycle. A
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
    for wing_room in WING:
        if name == f"relaylens.reporting.{wing_room}" or name.startswith(f"relaylens.reporting.{wing_room}."):
            return wing_room
    return None


def test_reporting_is_a_staircase():
    """Reporting modules import only reporting rooms below them (or their own room)."""
    problems = []
    for name, path in MODULES.items():
        wing_room = _wing_room(name)
        if wing_room is None:
            continue
        for module, imported, line in _imports(path):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in MODULES else module
            other = _wing_room(target)
            if other is not None and WING.index(other) > WING.index(wing_room):
                problems.append(f"{path.name}:{line} imports {target}, a room above {wing_room}")
    assert {_wing_room(n) for n in MODULES if n.startswith("relaylens.reporting.")} == set(WING)
    assert not problems, "\n".join(problems)


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


def test_no_private_name_crosses_a_file_boundary():
    """Package-wide: no module imports or reads another module's private name, or calls a private method of a class
    defined in another module (``store._load_unit``)."""
    members = _private_members()
    problems = []
    for name, path in MODULES.items():
        problems += _private_uses(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node,
                              ast.Attribute) or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                continue
            if members.get(node.attr, name) != name:
                problems.append(f"{path.name}:{node.lineno} uses {node.attr}, private to {members[node.attr]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _wing_room(n)))
def test_reporting_modules_are_small(name):
    """At most 310 lines besides the module's import statements (ruff's import sorting puts one name per line when a
    from-import passes 120 characters, which says nothing about how much the module does)."""
    text = MODULES[name].read_text()
    imports = sum(node.end_lineno - node.lineno + 1 for node in ast.parse(text).body
                  if isinstance(node, (ast.Import, ast.ImportFrom)))
    lines = text.count("\n") - imports
    assert lines <= 310, f"{name} has {lines} lines besides its imports; split it (one figure / one job per file)"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_all_resolves(name):
    """Every name a module lists in ``__all__`` exists in it."""
    if "__all__" not in MODULES[name].read_text():
        return
    module = importlib.import_module(name)
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not define: {missing}"


@pytest.mark.parametrize("old", sorted(relaylens.MOVED))
def test_every_old_module_path_imports_with_a_warning(old):
    """The alias table: ``relaylens.OLD`` imports, warns (naming the new home), and is the new home (or a facade
    whose names come from the new homes)."""
    homes = [f"relaylens.{home}" for home in relaylens.MOVED[old]]
    for key in [k for k in sys.modules if k == f"relaylens.{old}"]:
        del sys.modules[key]  # import it afresh so the warning fires
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(f"relaylens.{old}")
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(f"relaylens.{old} moved to" in m and homes[0] in m for m in messages), messages
    parts = [importlib.import_module(home) for home in homes]
    if len(parts) == 1:
        assert module is parts[0]
    for part in parts:
        for attr in [a for a in dir(part) if not a.startswith("_")][:50]:
            expected = next(getattr(p, attr) for p in parts if hasattr(p, attr))
            assert getattr(module, attr) is expected, f"relaylens.{old}.{attr}"


def test_names_that_broke_user_scripts_import_again():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "from relaylens.conditions import get_condition\n"  # a package now: no warning
            "warnings.simplefilter('default')\n"
            "from relaylens.records import load_records\n"
            "print(get_condition('relay').name, load_records.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert out.stdout.split() == ["relay", "relaylens.datasets"]
    assert "DeprecationWarning: relaylens.records moved to relaylens.datasets.records" in out.stderr
    assert out.stderr.startswith("<string>:4:"), out.stderr  # the warning points at the user's import line


def test_no_test_module_imports_another():
    tests = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        for module, imported, line in _imports(path):
            if module.split(".")[0] in tests | {"conftest"} or (module == "" and imported in tests):
                offenders.append(f"{path.name}:{line} imports {module or imported}")
        for stem in tests:  # also inside code strings run by subprocesses
            if f"from {stem} import" in text or f"import {stem}\n" in text:
                offenders.append(f"{path.name} mentions an import of {stem}")
    assert not offenders, "\n".join(offenders)


def test_tests_mirror_the_package_folders():
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"analyses"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert stages <= folders, f"no tests/<stage>/ folder for {sorted(stages - folders)}"
    assert folders - stages == {"acceptance", "browser", "gpu"}, folders - stages  # the tiers by cost


# Test files of a stage folder that name no module of the stage, each with its reason: a file that checks one module
# is tests/<stage>/test_<module>.py (or test_<module>_<aspect>.py). Named by rule instead: the reliability passes
# (test_reliability_*.py, hostile input across one stage) and the tiers by cost (tests/acceptance/, tests/browser/).
CROSS_CUTTING_TESTS = {
    "conditions/test_question_start.py": "one property (the question after every kept key) of every kind of condition",
    "datasets/test_datasets.py": "every dataset reader against its hand-written fixture",
    "experiments/test_analyses_qa.py": "the InfiniteBench and FINCH analyses end to end",
    "experiments/test_framing.py": "the framing analysis (relaylens/analyses/framing.py) end to end",
    "experiments/test_messages.py": "what runs, judge passes and the CLI print, across the top floor",
    "model/test_remote_code.py": "a scan: every transformers load in the package refuses remote code",
    "reporting/test_paper_metrics.py": "one judge's effect across every table and figure",
    "selectors/test_hyperparameters.py": "the hyperparameter checks of every selector",
    "selectors/test_selectors.py": "every attention-based selector against one brute-force reference",
}


def test_test_files_are_named_after_a_module_of_their_stage():
    """tests/<stage>/test_<module>.py mirrors relaylens/<stage>/<module>.py, so the tests of a module are found by
    its name; a file that checks no single module is on :data:`CROSS_CUTTING_TESTS` with its reason."""
    unnamed, stale = [], [name for name in CROSS_CUTTING_TESTS if not (ROOT / "tests" / name).exists()]
    for folder in sorted(p for p in (ROOT / "tests").iterdir() if (PACKAGE / p.name / "__init__.py").exists()):
        stage = PACKAGE / folder.name
        modules = {p.stem for p in stage.rglob("*.py") if p.stem != "__init__"} | {
            p.name for p in stage.rglob("*") if (p / "__init__.py").exists()}
        for path in sorted(folder.glob("test_*.py")):
            name = path.stem.removeprefix("test_")
            if not (name.startswith("reliability_") or f"{folder.name}/{path.name}" in CROSS_CUTTING_TESTS
                    or any(name == m or name.startswith(f"{m}_") for m in modules)):
                unnamed.append(f"tests/{folder.name}/{path.name}")
    assert not unnamed, (f"test files named after no module of their stage: {unnamed}; expected "
                         "tests/<stage>/test_<module>.py or test_<module>_<aspect>.py. Fix: rename the file after the "
                         "module it checks (git mv), or, for a cross-cutting check, add it to CROSS_CUTTING_TESTS "
                         "with its reason")
    assert not stale, f"CROSS_CUTTING_TESTS names files that do not exist: {stale}; remove them from the list"


def test_test_file_names_are_unique_across_folders():
    """Test folders are not packages (pytest's default import mode), so two test files with one name in two folders
    stop the whole suite with 'import file mismatch' when they are collected together."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}, {n: p for n, p in seen.items() if len(p) > 1}


def test_nothing_imports_a_top_level_analyses_package():
    """relaylens reaches the analyses only as relaylens.analyses (issue 14: a foreign ``analyses`` must never load)."""
    offenders = [f"{path.name}:{line}" for path in MODULES.values() for module, _, line in _imports(path)
                 if module == "analyses" or module.startswith("analyses.")]
    text = "\n".join(p.read_text() for p in MODULES.values())
    assert not offenders, offenders
    assert "import_module(f\"analyses" not in text and "import_module(\"analyses" not in text


FLAT_LAYOUT = json.loads((ROOT / "tests" / "fixtures" / "flat_layout_names.json").read_text())["modules"]
# Public names of the flat layout that were removed on purpose, each with its reason.
REMOVED = {
    ("generation",
     "check_history_fits"): "dead code: never called (histories are checked by the runner's history_problem)",
    ("prompting",
     "stop_strings"): "dead code: the stop rule lives in prompting.STOP_ON_NEWLINE and ExperimentSpec.stops_at_newline",
    ("bench_requests",
     "geometric_overhead"): "one Table 3 statistic: relaylens.reporting.overhead.geometric_mean_minus_one",
}


@pytest.mark.parametrize("old", sorted(FLAT_LAYOUT))
def test_every_public_name_of_the_flat_layout_resolves_from_its_old_path(old):
    """Recorded from the last flat-layout commit: ``from relaylens.OLD import NAME`` keeps working for every public
    name (through the alias table, or the package that took the module's name), except the names removed on
    purpose (:data:`REMOVED`, each with its reason)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(f"relaylens.{old}")
    missing = [n for n in FLAT_LAYOUT[old] if not hasattr(module, n) and not REMOVED.get((old, n))]
    assert not missing, f"relaylens.{old} lost {missing}"
