"""Browser tier of test_report.py: the per-layer HTML report from constructed tables, rendered in headless
Chromium."""

from __future__ import annotations

import re

import pytest
from support.browser import (  # tests/ helpers
    chromium,
    console_errors,
    not_blank,
    run_chromium,
)
from support.report_shared import LAYERS, html_fixture, tables_fixture, views  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.browser


def test_console_check_catches_a_broken_page(tmp_path):
    binary = chromium()
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>JSON.parse('{oops');</script></body></html>")
    result = run_chromium(binary, page, tmp_path, "--dump-dom")
    assert any("Uncaught" in line for line in console_errors(result.stderr)), result.stderr[-2000:]


def test_report_renders_in_headless_chromium(tmp_path, tables, write_run):
    binary = chromium()
    run = write_run(tmp_path / "run", tables, spec_figures=("figure6",))
    from typer.testing import CliRunner

    from relaylens.cli import app

    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    page = run / "report.html"
    dom = run_chromium(binary, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    # the embedded script ran and parsed the data
    assert f"3 condition rows, {LAYERS} layers" in dom.stdout
    shot = tmp_path / "report.png"
    rendered = run_chromium(binary, page, tmp_path, f"--screenshot={shot}")
    assert rendered.returncode == 0 and shot.exists(), rendered.stderr[-2000:]
    assert not console_errors(rendered.stderr), console_errors(rendered.stderr)
    colours, non_white = not_blank(shot)
    assert colours > 50 and non_white > 0.05, f"blank-looking screenshot: {colours} colours, {non_white:.3f} non-white"


def test_report_token_view_switches_layers_in_chromium(tmp_path, tables, write_run):
    """`relaylens report` on a run with stored views: the token view renders for 3 records, and the layer selector
    changes the shading and the screenshot (``#tv-layer=K`` preselects option K through the selector's own code)."""
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.results.views import write_view

    binary = chromium()
    run = write_run(tmp_path / "run", tables, spec_figures=())
    for view in views(records=4):
        write_view(run, view)
    result = CliRunner().invoke(app, ["report", str(run), "--view-records", "3"])
    assert result.exit_code == 0, result.output
    page = run / "report.html"
    html = page.read_text(encoding="utf-8")
    assert 'id="token-view"' in html and '"record_id":"r3"' not in html and '"record_id":"r2"' in html
    standalone = tmp_path / "token-view.html"  # the section alone at the top of a page, so the screenshot shows it
    section = html.split('<section id="token-view">')[1].split("</section>")[0]
    standalone.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{section}</body></html>",
                          encoding="utf-8")
    shading, shots = {}, {}
    for option in (3, 3 + LAYERS - 1):  # after the three bands: layer 0 and the last layer
        dom = run_chromium(binary, page, tmp_path, "--dump-dom", fragment=f"tv-layer={option}")
        assert dom.returncode == 0 and not console_errors(dom.stderr), console_errors(dom.stderr) or dom.stderr[-2000:]
        assert f'data-layer="{option}"' in dom.stdout
        shading[option] = re.findall(r"background-color: (rgba\([^)]*\))", dom.stdout)
        shot = tmp_path / f"token-view-{option}.png"
        rendered = run_chromium(binary, standalone, tmp_path, f"--screenshot={shot}", fragment=f"tv-layer={option}")
        assert rendered.returncode == 0 and shot.exists() and not console_errors(rendered.stderr)
        colours, non_white = not_blank(shot)
        assert colours > 20 and non_white > 0.02, f"blank-looking token view: {colours} colours, {non_white:.3f}"
        shots[option] = shot.read_bytes()
    first, last = shading.values()
    assert first and last and first != last, "switching layers left the shading unchanged"
    assert shots[3] != shots[3 + LAYERS - 1]
