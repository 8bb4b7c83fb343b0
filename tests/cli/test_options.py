"""The options of ``relaylens run`` / ``sweep`` (relaylens.cli.options): an analysis's own flags come from its record
(a toy analysis planted here gets its flag, its help panel and its runner's options without a change to the command
line), other analyses refuse them, and importing or asking the command line for help loads no analysis."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.cli.options import analysis_flags
from relaylens.experiments import specs
from relaylens.experiments.analysis import Analysis, CliOption
from relaylens.experiments.specs import ExperimentSpec

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    temperature: float = 1.0

    def replace(self, **changes) -> ToyOptions:
        return dataclasses.replace(self, **changes)


@pytest.fixture
def toy(monkeypatch):
    """A planted analysis ``toy`` whose runner records what it was given (and exits 0)."""
    seen = {}

    def run(spec, config, options):
        seen.update(spec=spec, config=config, options=options)
        raise SystemExit(0)

    record = Analysis(ExperimentSpec("toy", selectors=("streaming",), budgets=(0.5,), conditions=("original",)),
                      run=run, options=ToyOptions(), cli_options=(CliOption("temperature", float, "toy heat"),),
                      batch_rows=2)
    real_names, real_load = specs.available_analyses, specs.load_analysis
    monkeypatch.setattr(specs, "available_analyses", lambda: [*real_names(), "toy"])
    monkeypatch.setattr(specs, "load_analysis", lambda name: record if name == "toy" else real_load(name))
    analysis_flags.cache_clear()
    yield seen
    analysis_flags.cache_clear()


def test_a_planted_analysis_flag_reaches_its_runner(toy):
    result = CliRunner().invoke(app, ["run", "toy", "--temperature", "0.25", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert toy["options"] == ToyOptions(0.25) and toy["spec"].name == "toy"
    assert toy["config"].batch_rows == 2, "the record's batch_rows is the --batch-rows default"
    result = CliRunner().invoke(app, ["run", "toy", "--limit", "1", "--batch-rows", "1"])
    assert toy["options"] == ToyOptions(1.0) and toy["config"].batch_rows == 1


def test_the_decoding_path_reaches_the_run_config_and_bad_values_are_refused(toy):
    result = CliRunner().invoke(app, ["run", "toy", "--limit", "1", "--decoding", "static", "--compile-backend",
                                      "eager"])
    assert result.exit_code == 0, result.output
    assert (toy["config"].decoding, toy["config"].compile_backend) == ("static", "eager")
    result = CliRunner().invoke(app, ["run", "toy", "--limit", "1"])
    assert (toy["config"].decoding, toy["config"].compile_backend) == ("auto", None)
    result = CliRunner().invoke(app, ["run", "toy", "--decoding", "graph"])
    assert result.exit_code != 0 and "decoding must be one of ('auto', 'dynamic', 'static')" in result.output
    result = CliRunner().invoke(app, ["run", "toy", "--decoding", "dynamic", "--compile-backend", "inductor"])
    assert result.exit_code != 0 and "Fix: pass decoding='static'" in " ".join(result.output.split())


def test_a_planted_flag_is_listed_in_its_panel_and_refused_by_the_others(toy):
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    assert "--temperature" in help_text and "toy heat" in help_text and "toy only" in help_text
    result = CliRunner().invoke(app, ["run", "ordering", "--temperature", "2", "--steps", "3"])
    assert result.exit_code == 2
    assert ("--steps apply to learned_geometry only; --temperature apply to toy only; analysis ordering has no such "
            "option") in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["sweep", "toy", "--shards", "2"])
    assert result.exit_code == 2 and "does not run in shards" in result.output


def test_a_flag_declared_twice_is_refused(toy, monkeypatch):
    twin = Analysis(ExperimentSpec("twin", selectors=("streaming",), budgets=(0.5,), conditions=("original",)),
                    run=print, options=ToyOptions(), cli_options=(CliOption("temperature", float, "twin heat"),))
    load = specs.load_analysis
    monkeypatch.setattr(specs, "available_analyses", lambda: ["toy", "twin"])
    monkeypatch.setattr(specs, "load_analysis", lambda name: twin if name == "twin" else load(name))
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 2
    assert "analysis twin declares --temperature, which analysis toy declares too" in " ".join(result.output.split())


def test_learned_geometry_flags_come_from_its_record():
    import typer.main

    from relaylens.experiments.specs import load_analysis

    record = load_analysis("learned_geometry")
    run = typer.main.get_command(app).commands["run"]
    flags = {p.name: p for p in run.params if p.name in {f.name for f in record.cli_options}}
    assert list(flags) == [f.name for f in record.cli_options]
    assert {p.rich_help_panel for p in flags.values()} == {"Learned geometry (learned_geometry only)"}
    assert [p.help for p in flags.values()] == [f.help for f in record.cli_options]


def test_the_command_line_starts_without_analyses_or_torch():
    code = ("import sys; from typer.testing import CliRunner; from relaylens.cli import app\n"
            "for args in (['--help'], ['figures', '--help'], ['merge', '--help']):\n"
            "    assert CliRunner().invoke(app, args).exit_code == 0, args\n"
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers') or m.startswith('relaylens.analyses.'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_python_m_runs_the_package_and_every_command_keeps_its_place():
    out = subprocess.run([sys.executable, "-m", "relaylens.cli", "run", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--learning-rate" in out.stdout and "--view-records" in out.stdout
    import typer.main

    root = typer.main.get_command(app)
    assert list(root.commands) == ["bench", "run", "sweep", "merge", "judge", "figures", "report", "demo", "model",
                                   "data"]
    assert list(root.commands["model"].commands) == ["pull", "check"]
