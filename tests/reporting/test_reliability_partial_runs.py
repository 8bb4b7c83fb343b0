"""Reports and figures of runs that are not whole (issue 28): units missing against the plan, every unit skipped,
SPEC.figures the tables cannot support, a malformed manifest spec, and a run directory that is only read."""

from __future__ import annotations

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.results.store import RunStore, UnitKey, build_manifest
from relaylens.results.tables import example_tables

IDS = [f"r{k}" for k in range(6)]


def _cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def _units(store, ids, skipped=False):
    """Commit one bm25 @ 0.1 unit per record id: the example tables' rows, or a ``too_long`` skip."""
    tables = example_tables(records=len(IDS), selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"),
                            replay=(), layers=2, teacher=False)
    for rid in ids:
        key = UnitKey(rid, "bm25", 0.1)
        if skipped:
            row = dict(record_id=rid, selector="bm25", budget=0.1, reason="too_long", history_length=9000,
                       detail=f"record {rid}: history of 9000 tokens exceeds --max-history-tokens 8000")
            store.write_unit(key, [], [], [], skipped_rows=[row])
            continue
        part = {n: df[df.record_id == rid] for n, df in tables.items()}
        store.write_unit(key, part["answers"], part["scores"], part["probes"])
    store.consolidate()
    return store.run_dir


def _planned_run(tmp_path, ids=IDS, analysis="ordering", figures=("table1",), skipped=False):
    spec = {"selectors": ["bm25"], "budgets": [0.1], "figures": list(figures)}
    m = build_manifest(analysis, {"seed": 0, "spec": spec}, "tiny", "ab", plan={"record_ids": IDS, "units": len(IDS)})
    return _units(RunStore.create_or_open(tmp_path / "run", m), ids, skipped)


def test_report_and_figures_of_a_killed_run_say_k_of_n_planned(tmp_path):
    run = _planned_run(tmp_path, IDS[:3])  # killed after 3 of its 6 units
    report = _cli("report", run)
    assert report.exit_code == 0, report.output
    assert "3 of 6 planned units" in (run / "report.html").read_text()
    assert "warning:" in report.stderr and "3 of the 6 units" in report.stderr
    figures = _cli("figures", run, "--format", "png")
    assert figures.exit_code == 0, figures.output
    assert "incomplete run: 3 of 6 planned units" in (run / "figures" / "table1.md").read_text()
    whole = _planned_run(tmp_path / "whole")
    assert _cli("report", whole).exit_code == 0
    html = (whole / "report.html").read_text()
    assert "6 of 6 planned units" in html and "incomplete" not in html


def test_report_of_a_run_whose_every_unit_was_skipped_shows_the_skipped_table(tmp_path):
    run = _planned_run(tmp_path, skipped=True)
    result = _cli("report", run)
    assert result.exit_code == 0, result.output
    html = (run / "report.html").read_text()
    assert 'id="table-skipped"' in html and html.count("history of 9000 tokens exceeds") >= len(IDS)
    figures = _cli("figures", run)
    assert figures.exit_code == 0, figures.output
    assert "every committed unit of the run was skipped (6 units; too_long: 6)" in figures.stderr


def test_figures_say_which_spec_tables_were_skipped_and_how_to_get_them(tmp_path):
    run = _planned_run(tmp_path, analysis="summarization", figures=("table10", "table11"))  # no checklist scores
    result = _cli("figures", run, "--format", "png")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    for name in ("table10", "table11"):
        assert any(f"{name} not drawn: no checklist judge scores" in line and "relaylens judge RUN_DIR" in line
                   and "--judge-model" in line for line in lines), result.stderr
    index = json.loads((run / "figures" / "index.json").read_text())
    assert sorted(index["not_drawn"]) == ["table10", "table11"]
    assert _cli("report", run).exit_code == 0
    assert "table10: no checklist judge scores" in (run / "report.html").read_text()


@pytest.mark.parametrize("spec", ["ordering", ["table1"], 3, None], ids=["string", "list", "number", "null"])
@pytest.mark.parametrize("command", ["report", "figures"])
def test_manifest_spec_that_is_not_an_object(tmp_path, spec, command):
    run = _planned_run(tmp_path)
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["config"]["spec"] = spec
    path.write_text(json.dumps(manifest))
    result = _cli(command, run, *(["--format", "png"] if command == "figures" else []))
    assert result.exit_code == 0, result.output
    if spec is not None:
        assert "warning:" in result.stderr and "config.spec should be an object" in result.stderr


def _read_only(monkeypatch, run):
    """Make ``run`` read-only; as root (where modes do not bind) refuse the lock file's creation in it too."""
    import relaylens.fileio as fileio  # every lock is opened there

    for path in [run, *run.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    real = os.open

    def refuse(path, flags, *args):
        if str(path).startswith(str(run) + os.sep) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(fileio.os, "open", refuse)


@pytest.mark.parametrize("command", ["report", "figures"])
def test_read_only_run_renders_into_another_out(tmp_path, monkeypatch, command):
    run = _planned_run(tmp_path / "ro")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    _read_only(monkeypatch, run)
    try:
        out = tmp_path / ("elsewhere.html" if command == "report" else "figs")
        result = _cli(command, run, "--out", out, *(["--format", "png"] if command == "figures" else []))
        assert result.exit_code == 0, result.output
        assert out.exists() and {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
        refused = _cli(command, run)  # its default output lies inside the read-only run: refused, one clear line
        assert refused.exit_code == 2 and "Fix" in refused.stderr
    finally:
        for path in [run, *run.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
