"""The one registry idiom (relaylens/registry.py) and plugins through entry points.

The registry itself: lazy ``"module:attribute"`` entries imported on first use, aliases, names and aliases that
collide refused naming both owners, unknown names answered with the known ones, ``frozen()`` restoring the contents
(also on an error), the mapping operations the old dicts offered (``monkeypatch.setitem`` included).

Plugins: a real distribution written to a temporary folder (``*.dist-info/METADATA`` + ``entry_points.txt``) and put
on ``sys.path``, where ``importlib.metadata`` finds it as it finds an installed one. It defines a selector (keep the
most recent share of the history), a probe kind, a condition, a figure, a dataset format and a benchmark; the selector
and the probe kind run in a real analysis of the tiny test model, and their names land in the result tables. A broken
plugin (a module that does not import, a name that is taken) is a warning when a registry is listed and an error
naming the distribution and the entry point when it is asked for by name; unrelated lookups keep working.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from relaylens.errors import RelaylensError
from relaylens.registry import Registry, RegistryError, UnknownNameError, load_reference

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------ the registry


def test_register_lookup_alias_and_order():
    reg = Registry("colour")
    assert reg.register("red", (255, 0, 0), aliases=("rouge",)) == (255, 0, 0)

    @reg.register("blue")
    def blue():
        return (0, 0, 255)

    reg.alias("bleu", "blue")
    assert list(reg) == reg.names() == ["red", "blue"] and len(reg) == 2  # aliases are not listed
    assert reg["rouge"] == reg.get("red") == (255, 0, 0) and reg["bleu"] is blue
    assert "rouge" in reg and "bleu" in reg and "green" not in reg and 3 not in reg
    assert reg.canonical("rouge") == "red" and dict(reg.items()) == {"red": (255, 0, 0), "blue": blue}
    assert reg.get("green", None) is None and reg.owner("red") == "tuple"
    with pytest.raises(UnknownNameError, match=r"unknown colour 'green'; known: red, blue") as caught:
        reg.get("green")
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, RelaylensError)
    with pytest.raises(KeyError):
        reg["green"]  # noqa: B018 - a mapping's missing key
    reg.reorder(["blue"])
    assert list(reg) == ["blue", "red"]
    del reg["red"]
    assert list(reg) == ["blue"] and "rouge" not in reg  # its aliases go with it


def test_collisions_are_refused_naming_both_owners():
    reg = Registry("colour")
    reg.register("red", (255, 0, 0), aliases=("rouge",), owner="the palette")
    with pytest.raises(RegistryError, match=r"colour 'red' is already registered by the palette; the paint shop "
                                            r"cannot register it again\. Fix: give the new colour another name"):
        reg.register("red", (254, 0, 0), owner="the paint shop")
    with pytest.raises(RegistryError, match="'rouge' is already registered by the palette"):
        reg.register("crimson", (220, 20, 60), aliases=("rouge",))  # an alias collides too
    with pytest.raises(RegistryError, match="'red' is already registered"):
        reg.alias("red", "red")
    with pytest.raises(RegistryError, match="given twice"):
        reg.register("green", (0, 255, 0), aliases=("green",))
    assert list(reg) == ["red"] and "crimson" not in reg  # nothing half-registered


def test_lazy_entries_import_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "lazy_colour_module.py").write_text("IMPORTED = True\nGREEN = (0, 255, 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_colour_module", raising=False)
    reg = Registry("colour")
    assert reg.register("green", "lazy_colour_module:GREEN") == "lazy_colour_module:GREEN"
    assert "green" in reg and list(reg) == ["green"] and "lazy_colour_module" not in sys.modules  # listed, not loaded
    assert reg["green"] == (0, 255, 0) and "lazy_colour_module" in sys.modules
    reg.register("missing", "lazy_colour_module:NOPE")
    with pytest.raises(AttributeError):  # relaylens's own lazy entry: a bug, raised as it is
        reg["missing"]  # noqa: B018
    assert load_reference("json:dumps")([1]) == "[1]"
    with pytest.raises(RegistryError, match="not a reference of the form 'module.path:attribute'"):
        load_reference("no spaces allowed: here")


def test_check_refuses_objects_of_another_kind():
    def check(name, obj):
        if not isinstance(obj, tuple):
            raise RegistryError(f"colour {name!r} must be an RGB tuple; got {obj!r}")

    reg = Registry("colour", check=check)
    reg.register("red", "json:dumps")  # lazy: checked when it is loaded
    with pytest.raises(RegistryError, match="must be an RGB tuple"):
        reg["red"]  # noqa: B018
    with pytest.raises(RegistryError, match="must be an RGB tuple"):
        reg.register("blue", [0, 0, 255])
    with pytest.raises(RegistryError, match="must be an RGB tuple"):
        reg["green"] = "green"


def test_frozen_restores_the_contents_also_on_an_error():
    reg = Registry("colour")
    reg.register("red", (255, 0, 0))
    with reg.frozen():
        reg.register("blue", (0, 0, 255), aliases=("bleu",))
        del reg["red"]
        assert list(reg) == ["blue"]
    assert list(reg) == ["red"] and "bleu" not in reg
    with pytest.raises(ZeroDivisionError):
        with reg.frozen():
            reg.register("green", (0, 255, 0))
            1 / 0  # noqa: B018
    assert list(reg) == ["red"]


def test_monkeypatch_setitem_works_as_on_a_dict(monkeypatch):
    from relaylens.bench import registry

    before = list(registry.BENCHMARKS)
    toy = registry.Benchmark(lambda **options: [{"case": "toy"}])
    monkeypatch.setitem(registry.BENCHMARKS, "toy", toy)
    monkeypatch.setitem(registry.BENCHMARKS, "geometry", toy)
    assert registry.BENCHMARKS["toy"] is toy and registry.BENCHMARKS["geometry"] is toy
    monkeypatch.undo()
    assert list(registry.BENCHMARKS) == before and registry.BENCHMARKS["geometry"] is not toy


def test_every_registry_keeps_its_mapping_face():
    from relaylens.bench.registry import BENCHMARKS
    from relaylens.conditions.catalogue import CONDITIONS
    from relaylens.datasets import FORMATS
    from relaylens.datasets import REGISTRY as FORMAT_REGISTRY
    from relaylens.probes.registry import PROBE_KINDS, PROBES
    from relaylens.reporting.figures import REGISTRY as FIGURES
    from relaylens.selectors import REGISTRY as SELECTORS

    for registry in (BENCHMARKS, CONDITIONS, FORMAT_REGISTRY, PROBE_KINDS, FIGURES, SELECTORS):
        assert isinstance(registry, Registry)
        assert list(registry) == [name for name, _ in registry.items()] == list(registry.keys())
        assert len(registry) == len(list(registry.values())) > 0
    assert tuple(FORMAT_REGISTRY)[:len(FORMATS)] == FORMATS
    assert [p.name for p in PROBES][:4] == ["replay", "sensitivity", "layer_sweep", "token_view"]
    assert list(FIGURES)[:3] == ["table1", "table2", "table6"]  # drawing order (ORDER first)
    assert SELECTORS["snapkv"].name == "snapkv" and CONDITIONS["relay"].name == "relay"


# ------------------------------------------------------------------------------------------------ plugins

PLUGIN = '''
"""A relaylens plugin in another distribution: one object per entry-point group."""

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch

from relaylens.bench.registry import Benchmark
from relaylens.conditions.catalogue import Condition, make_coordinates
from relaylens.datasets.formats import DatasetFormat
from relaylens.geometry.selection import Selection
from relaylens.probes.unit import ProbeTables
from relaylens.reporting.figures.registry import FigureEntry
from relaylens.selectors import Selector, resolve_budget


@dataclass(frozen=True)
class KeepLast(Selector):
    """Keep the most recent states: the last ``budget`` of the history in every (layer, kv head)."""

    name: ClassVar[str] = "keep_last"

    def select(self, prefill, prompt=None, budget=0.10) -> Selection:
        length = prefill.history_length
        k = resolve_budget(budget, length)
        shape = (prefill.num_layers, prefill.num_kv_heads, k)
        keep = torch.arange(length - k, length).expand(shape).clone()  # [layer, kv_head, slot]
        scores = (keep + 1).float() / length  # recency
        return Selection(keep, torch.ones(shape, dtype=torch.bool), length, scores, info={"selector": self.name})


@dataclass(frozen=True)
class KeptCount:
    """A probe kind with its own switch (``--probe kept_count``): how many states each layer keeps."""

    name: str = "kept_count"

    def enabled(self, spec, config) -> bool:
        return self.name in spec.probe_kinds

    def run(self, unit) -> ProbeTables:
        counts = unit.selection.counts.sum(-1)  # [layer]
        frame = pd.DataFrame({"layer": range(len(counts)), "head": -1, "metric": "kept_count",
                              "value": counts.double().tolist(), "condition": "original",
                              "probe_point": "question_final", "source": "kept_count"})
        return ProbeTables(probes=(frame,))


KEPT_COUNT = KeptCount()


@dataclass(frozen=True)
class LateQuestion(Condition):
    """Keys where they were; the question ``shift`` positions later."""

    shift: int = 16
    name = "late_question"
    parameter = ("shift", int)

    @property
    def label(self) -> str:
        return f"late_question({self.shift})"

    def coordinates(self, sel):
        return make_coordinates(self.label, sel, sel.positions, sel.history_length + self.shift)


def kept_table(tables):
    return tables["scores"].groupby("selector").size().rename("rows").reset_index()


KEPT_TABLE = FigureEntry("kept_table", "table", "rows per selector", kept_table, lambda tables: None)


def read_lines(path, collector, **options):
    pass


LINES = DatasetFormat("lines", read_lines, lambda path: str(path).endswith(".lines"))
NOTHING = Benchmark(lambda **options: [{"case": "nothing"}])
'''

ENTRY_POINTS = '''
[relaylens.selectors]
keep_last = relaylens_demo_plugin:KeepLast

[relaylens.probes]
kept_count = relaylens_demo_plugin:KEPT_COUNT

[relaylens.conditions]
late_question = relaylens_demo_plugin:LateQuestion

[relaylens.figures]
kept_table = relaylens_demo_plugin:KEPT_TABLE

[relaylens.datasets]
lines = relaylens_demo_plugin:LINES

[relaylens.benchmarks]
nothing = relaylens_demo_plugin:NOTHING
'''

BROKEN_ENTRY_POINTS = '''
[relaylens.selectors]
broken = relaylens_missing_module:Nope
snapkv = relaylens_demo_plugin:KeepLast
not_a_selector = relaylens_demo_plugin:KEPT_COUNT
'''


PLUGIN_ENTRIES = {"relaylens.selectors": ("keep_last", "KeepLast"), "relaylens.probes": ("kept_count", "KEPT_COUNT"),
                  "relaylens.conditions": ("late_question", "LateQuestion"),
                  "relaylens.figures": ("kept_table", "KEPT_TABLE"), "relaylens.datasets": ("lines", "LINES"),
                  "relaylens.benchmarks": ("nothing", "NOTHING")}
"""Per entry-point group, the demo plugin's entry: (name, attribute of relaylens_demo_plugin)."""


def write_distribution(root: Path, name: str, entry_points: str, module: str | None = None) -> None:
    """A distribution as an installer leaves it: its ``NAME-VERSION.dist-info`` (metadata, entry points) and, if
    given, its module."""
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points).lstrip())
    if module is not None:
        (root / "relaylens_demo_plugin.py").write_text(textwrap.dedent(module).lstrip())


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """A folder holding the demo plugin's distribution, on ``sys.path``; the plugin module is forgotten afterwards."""
    root = tmp_path / "site"
    write_distribution(root, "relaylens-demo-plugin", ENTRY_POINTS, PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "relaylens_demo_plugin", raising=False)
    yield root
    sys.modules.pop("relaylens_demo_plugin", None)


def all_registries():
    from relaylens.bench.registry import BENCHMARKS
    from relaylens.conditions.catalogue import CONDITIONS
    from relaylens.datasets import REGISTRY as FORMATS
    from relaylens.probes.registry import PROBE_KINDS
    from relaylens.reporting.figures import REGISTRY as FIGURES
    from relaylens.selectors import REGISTRY as SELECTORS

    return {"relaylens.selectors": SELECTORS, "relaylens.probes": PROBE_KINDS, "relaylens.conditions": CONDITIONS,
            "relaylens.figures": FIGURES, "relaylens.datasets": FORMATS, "relaylens.benchmarks": BENCHMARKS}


class discovered:
    """Within the ``with`` block, every registry holds the entry points on ``sys.path`` now (``discover()``: the
    registries of this test process may have read theirs before the plugin's folder was on the path); on the way out
    they hold what they held before."""

    def __enter__(self):
        self.blocks = [registry.frozen() for registry in all_registries().values()]
        for block in self.blocks:
            block.__enter__().discover()
        return all_registries()

    def __exit__(self, *exc):
        for block in reversed(self.blocks):
            block.__exit__(*exc)


def test_a_plugin_joins_every_registry(plugin_path):
    from relaylens.conditions import get_condition
    from relaylens.datasets import detect_format
    from relaylens.geometry.selection import Selection
    from relaylens.selectors import make_selector
    from relaylens.selectors.synthetic import random_prefill

    with discovered() as registries:
        for group, (name, attribute) in PLUGIN_ENTRIES.items():
            registry = registries[group]
            assert name in list(registry) and name in registry
            assert registry.owner(name) == (f"plugin relaylens-demo-plugin (entry point {name} = "
                                            f"relaylens_demo_plugin:{attribute} in group {group})")
        sel = make_selector("keep_last").select(random_prefill(length=40), None, 0.25)
        assert sel.positions[0, 0].tolist() == list(range(30, 40))
        condition = get_condition("late_question(7)")
        assert condition.label == "late_question(7)" and get_condition("late_question(7)@layers=0").inner == condition
        coords = condition.coordinates(Selection.from_lists([[[2, 5, 6]]], history_length=10))
        assert coords.question_start == 17 and coords.key_positions[0, 0].tolist() == [2, 5, 6]
        (plugin_path / "x.lines").write_text("")
        assert detect_format(plugin_path / "x.lines") == "lines"  # sniffed after the built-in formats
        assert list(registries["relaylens.figures"])[-1] == "kept_table"
        assert registries["relaylens.benchmarks"]["nothing"]() == [{"case": "nothing"}]
    for registry in all_registries().values():  # gone after the block
        assert not any(registry.owner(name).startswith("plugin relaylens-demo") for name in registry)


def test_a_broken_plugin_is_skipped_when_listing_and_named_when_asked_for(plugin_path):
    from relaylens.selectors import REGISTRY, SnapKV, make_selector

    write_distribution(plugin_path, "relaylens-broken-plugin", BROKEN_ENTRY_POINTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with discovered():
            taken = [str(w.message) for w in caught]
            assert any("selector 'snapkv' is already registered by relaylens.selectors.snapkv.SnapKV; plugin "
                       "relaylens-broken-plugin (entry point snapkv = relaylens_demo_plugin:KeepLast in group "
                       "relaylens.selectors) cannot register it again" in m and "rename the entry point" in m
                       for m in taken), taken
            assert REGISTRY["snapkv"] is SnapKV  # the built-in keeps its name
            caught.clear()
            names = list(REGISTRY)
            assert "keep_last" in names and "broken" not in names and "not_a_selector" not in names
            messages = [str(w.message) for w in caught]
            assert any("selector 'broken' of plugin relaylens-broken-plugin (entry point broken = "
                       "relaylens_missing_module:Nope in group relaylens.selectors) cannot be loaded: "
                       "ModuleNotFoundError" in m for m in messages), messages
            assert any("selector 'not_a_selector' of plugin relaylens-broken-plugin" in m and "not a Selector class"
                       in m for m in messages), messages
            with pytest.raises(RegistryError, match=r"selector 'broken' of plugin relaylens-broken-plugin \(entry "
                                                    r"point broken = relaylens_missing_module:Nope"):
                make_selector("broken")
            assert make_selector("snapkv", window=8).window == 8  # unrelated lookups keep working
            caught.clear()
            assert "broken" not in list(REGISTRY) and not caught  # warned once


def test_a_plugin_selector_and_probe_run_in_an_analysis(plugin_path, tmp_path):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import ExperimentSpec
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=5, history_tokens=900)))
    with discovered():
        spec = ExperimentSpec("plugin_run", selectors=("keep_last", "bm25"), budgets=(0.4,),
                              conditions=("original", "relay"), probes=True, max_new_tokens=2,
                              probe_kinds=("kept_count",))
        assert spec.to_dict()["probe_kinds"] == ("kept_count",)
        out = run_analysis(spec, RunConfig(data=str(data), out=str(tmp_path / "run")), progress=False,
                           model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    tables = load_tables(out)
    scores, probes = tables["scores"], tables["probes"]
    assert set(scores.selector) == {"keep_last", "bm25"}
    assert set(scores[scores.selector == "keep_last"].condition) >= {"original", "relay"}
    rows = probes[probes.source == "kept_count"]
    assert len(rows) == 2 * 2 * 2 and set(rows.selector) == {"keep_last", "bm25"}  # records x selectors x layers
    assert set(rows.metric) == {"kept_count"} and (rows.value > 0).all()
    assert {"forward", "kept_count"} <= set(probes.source)  # beside the built-in readouts


def test_a_plugin_probe_kind_is_switched_on_from_the_command_line(plugin_path, tmp_path):
    """``relaylens run --probe kept_count``: the plugin's kind runs, with no field or option of relaylens edited for
    it; without ``--probe`` it stays off; an unknown name is one line naming the registered kinds."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir, data = tmp_path / "tiny-llama", tmp_path / "records.json"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data.write_text(json.dumps(generate_records(n=1, seed=5, history_tokens=900)))
    env = {**__import__("os").environ, "PYTHONPATH": f"{plugin_path}:{ROOT}"}

    def run(out: str, *probe: str):
        return subprocess.run([sys.executable, "-m", "relaylens.cli", "run", "coordinate_ablation", "--model",
                               str(model_dir), "--data", str(data), "--limit", "1", "--max-new-tokens", "2",
                               "--condition", "relay", "--selector", "keep_last", "--budget", "0.4", *probe,
                               "--out", str(tmp_path / out)], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=600)

    done = run("on", "--probe", "kept_count")
    assert done.returncode == 0, done.stderr[-3000:]
    probes = load_tables(tmp_path / "on")["probes"]
    assert set(probes[probes.source == "kept_count"].metric) == {"kept_count"}
    spec = json.loads((tmp_path / "on" / "manifest.json").read_text())["config"]["spec"]
    assert spec["probe_kinds"] == ["kept_count"]
    done = run("off")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kept_count" not in set(load_tables(tmp_path / "off")["probes"].source)
    assert "probe_kinds" not in json.loads((tmp_path / "off" / "manifest.json").read_text())["config"]["spec"]
    done = run("bad", "--probe", "kept_cuont")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "kept_cuont" in done.stderr and "'kept_count'" in done.stderr


def test_a_fresh_interpreter_finds_plugins_on_first_use(plugin_path):
    """No ``discover()``: the first lookup or iteration of each registry reads the entry points by itself."""
    code = textwrap.dedent("""
        import relaylens.selectors as selectors, relaylens.probes.registry as probes
        import relaylens.conditions.catalogue as conditions
        print("keep_last" in selectors.REGISTRY, [p.name for p in probes.PROBES][-1],
              conditions.parse_condition("late_question(3)").label)
    """)
    env = {**__import__("os").environ, "PYTHONPATH": f"{plugin_path}:{ROOT}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "kept_count", "late_question(3)"]
