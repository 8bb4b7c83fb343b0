"""Analyses load from relaylens's own ``relaylens.analyses`` only: a foreign ``analyses`` package in the working
directory or on PYTHONPATH is never imported (its code never runs), and bad names are refused clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaylens.errors import RelaylensError
from relaylens.experiments.specs import (
    ExperimentSpec,
    available_analyses,
    load_analysis,
)

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "from pathlib import Path\nPath({marker!r}).write_text({what!r})\nSPEC = None\n"


def _hostile_package(folder: Path, marker: Path) -> None:
    """An ``analyses`` package whose import (of the package or any analysis name) writes ``marker``."""
    pkg = folder / "analyses"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(HOSTILE.format(marker=str(marker), what="package"))
    for name in ("ordering", "no_such_analysis"):
        (pkg / f"{name}.py").write_text(HOSTILE.format(marker=str(marker), what=name))


@pytest.mark.parametrize("where", ["cwd", "pythonpath"])
@pytest.mark.parametrize("argv", [["run", "ordering", "--data", "no-such-file.json"], ["run", "no_such_analysis"]],
                         ids=["known", "unknown"])
def test_foreign_analyses_package_never_runs(tmp_path, where, argv):
    hostile, marker = tmp_path / "hostile", tmp_path / "MARKER"
    _hostile_package(hostile, marker)
    env = {**os.environ}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if where == "pythonpath":  # first on the path, ahead of relaylens's own checkout
        env["PYTHONPATH"] = os.pathsep.join([str(hostile)] + path)
    result = subprocess.run([sys.executable, "-m", "relaylens.cli", *argv], cwd=hostile if where == "cwd" else tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), f"relaylens imported the foreign analyses package ({marker.read_text()})"
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    if argv[1] == "no_such_analysis":
        assert "unknown analysis 'no_such_analysis'" in result.stderr + result.stdout
    else:
        assert "no-such-file.json" in result.stderr + result.stdout  # got as far as the data: the real SPEC loaded


def test_analyses_load_from_relaylens_only():
    record = load_analysis("ordering")
    assert record is sys.modules["relaylens.analyses.ordering"].ANALYSIS
    assert isinstance(record.spec, ExperimentSpec) and record.spec.name == "ordering"
    assert "analyses" not in sys.modules  # no top-level package was imported on the way
    shipped = sorted(p.stem for p in (ROOT / "relaylens" / "analyses").glob("[a-z]*.py"))
    assert available_analyses() == shipped


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "ordering.SPEC", "os", "__init__", "_private", "Ordering"])
def test_bad_analysis_names_are_refused(name):
    with pytest.raises(RelaylensError, match="unknown analysis|is not a plain name"):
        load_analysis(name)


def test_probe_kinds_by_name_set_the_built_in_switches_and_keep_one_manifest_spelling():
    from relaylens.experiments.specs import ExperimentSpec

    base = dict(name="p", selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    by_name = ExperimentSpec(**base, probe_kinds=("sensitivity", "layer_sweep", "token_view"))
    by_switch = ExperimentSpec(**base, sensitivity=True, sweep="layers", probes=True)
    assert by_name == by_switch and by_name.probe_kinds == ()
    assert by_name.to_dict() == by_switch.to_dict() and "probe_kinds" not in by_name.to_dict()


@pytest.mark.parametrize("kinds, message", [(("no_such_kind",), "no_such_kind"),
                                            (("sensitivity", "sensitivity"), "each kind once")])
def test_bad_probe_kind_names_are_refused_naming_the_registered_kinds(kinds, message):
    from relaylens.errors import RelaylensError
    from relaylens.experiments.specs import ExperimentSpec

    with pytest.raises(RelaylensError, match=message) as caught:
        ExperimentSpec("p", ("bm25",), (0.1,), ("original",), probe_kinds=kinds)
    assert "'layer_sweep'" in str(caught.value)  # the registered kinds are named


def test_the_analyses_are_a_registry_listed_without_importing_a_module():
    """The seventh registry uses the one idiom: lazy ``module:ANALYSIS`` entries (listing imports no analysis), a
    record checked on first use, and a frozen view in which a test adds an analysis for one block."""
    code = ("import sys\nfrom relaylens.experiments.specs import ANALYSES, available_analyses\n"
            "names = available_analyses()\nprint(len(names), any(m.startswith('relaylens.analyses.') for m in "
            "sys.modules))\nprint(ANALYSES['ordering'].name, 'relaylens.analyses.ordering' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(available_analyses())), "False", "ordering", "True"]
    from relaylens.experiments.analysis import Analysis
    from relaylens.experiments.specs import ANALYSES

    toy = Analysis(ExperimentSpec("toy", ("bm25",), (0.1,), ("original", "relay")))
    with ANALYSES.frozen():
        ANALYSES.register("toy", toy)
        assert load_analysis("toy") is toy and "toy" in available_analyses()
        with pytest.raises(RelaylensError, match="declares an analysis named 'toy'"):
            ANALYSES.register("other", toy)
            load_analysis("other")
    assert "toy" not in available_analyses()
