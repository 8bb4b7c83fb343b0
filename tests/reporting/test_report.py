"""The per-layer HTML report from constructed tables: structure, exact per-layer data, offline-only content,
escaping, missing pieces, a real render in headless Chromium (screenshot not blank, no console errors), and the
cross-run report of several run directories (Table 1 per model x dataset, Table 8's count, the cross-judge table)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from support.report_shared import LAYERS, MANIFEST, html_fixture, tables_fixture, views  # noqa: F401 - pytest fixtures

from relaylens.reporting import figures, report, summaries
from relaylens.results.tables import example_tables


@pytest.fixture(autouse=True)
def fast_bootstrap(monkeypatch):
    monkeypatch.setattr(summaries, "N_RESAMPLES", 200)


def _data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="relaylens-data">(.*?)</script>', html, re.S)
    assert m, "embedded data block missing"
    return json.loads(m.group(1))


def test_one_section_per_layer(html):
    ids = re.findall(r'<section id="layer-(\d+)"', html)
    assert ids == [str(layer) for layer in range(LAYERS)]
    assert len(set(re.findall(r'\bid="([^"]+)"', html))) == len(re.findall(r'\bid="([^"]+)"', html)), "duplicate ids"


def test_nothing_points_to_the_network(html):
    assert "http://" not in html and "https://" not in html and "://" not in html
    assert "example.org" in html and "evil.example" in html  # the strings are shown, just not as URLs
    for attr, value in re.findall(r'\b(src|href)="([^"]*)"', html):
        assert value.startswith(("data:image/png;base64,", "#")), f"{attr}={value[:40]} would load a resource"
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "uuid" not in html.lower()


def test_answers_are_escaped(html):
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html


def test_embedded_layer_data_is_exact(tables, html):
    data = _data(html)
    probes = tables["probes"]
    sel = (probes["probe_point"] == "question_final") & (probes["source"] == "forward") & (
        probes["metric"] == "evidence_share")
    for layer in range(LAYERS):
        for cond in ("original", "relay"):
            want = probes[sel & (probes["layer"] == layer) & (probes["condition"] == cond)]["value"].mean()
            got = [r for r in data["layers"] if r["layer"] == layer and r["condition"] == cond and
                   r["metric"] == "evidence_share" and r["probe_point"] == "question_final"
                   and r["source"] == "forward"]
            assert len(got) == 1 and got[0]["value"] == pytest.approx(want)
        base = [r for r in data["layers"] if r["layer"] == layer and r["condition"] == "original"
                and r["metric"] == "evidence_share" and r["probe_point"] == "question_final"][0]
        relay = [r for r in data["layers"] if r["layer"] == layer and r["condition"] == "relay"
                 and r["metric"] == "evidence_share" and r["probe_point"] == "question_final"
                 and r["source"] == "forward"][0]
        assert relay["delta_pp"] == pytest.approx(100 * (relay["value"] - base["value"]))
    bands = {r["layer"]: r["band"] for r in data["layers"]}
    assert [bands[layer] for layer in range(LAYERS)] == ["early", "early", "middle", "late"]
    section = html.split('<section id="layer-3"')[1].split("</section>")[0]
    assert "late band" in section and "evidence_share (forward)" in section and "final question token" in section


def test_condition_table_and_drilldown(tables, html):
    data = _data(html)
    assert {r["condition"] for r in data["conditions"]} == {"original", "half_gap", "relay"}
    answers = tables["answers"]
    first = answers.iloc[0]
    assert f"gold units kept {first['gold_units_kept']}/{first['gold_units_total']}" in html
    assert html.count('<details id="rec-') == answers[["record_id", "selector", "budget"]].drop_duplicates().shape[0]
    assert 'id="heatmap"' in html and 'id="figure-figure6"' in html


def test_deterministic(tables, html):
    assert report.render_report(tables, MANIFEST) == html


def test_run_without_probes_has_a_note_and_no_layer_sections(tables):
    no_probes = {**tables, "probes": tables["probes"].iloc[:0]}
    out = report.render_report(no_probes, {"analysis": "main_table", "config": {"spec": {"figures": ["table1"]}}})
    assert '<section id="layer-' not in out and 'id="no-probes"' in out and "no per-layer sections" in out
    assert _data(out)["layers"] == []


def test_empty_tables_are_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.results.store import RunStore

    RunStore.create_or_open(tmp_path / "empty", {"analysis": "evidence_reading", "config": {}})
    result = CliRunner().invoke(app, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "empty" in result.output
    with pytest.raises(figures.FigureError, match="empty"):
        report.render_report({n: df.iloc[:0] for n, df in example_tables(records=1, probes=False).items()}, {})


# ------------------------------------------------------------------------------------------- headless Chromium


def test_token_view_section(tables):
    html = report.render_report(tables, MANIFEST, views=views())
    assert html.count('<section id="token-view">') == 1 and 'class="rl-tv-layer"' in html
    assert "://" not in html.split('<section id="token-view">')[1]
    payload = re.search(r'<div class="rl-tv" id="relaylens-token-view">.*?'
                        r'<script type="application/json">(.*?)</script>',
                        html, re.S)
    assert [v["record_id"] for v in json.loads(payload.group(1))] == ["r0", "r1", "r2"]
    assert '<section id="token-view">' not in report.render_report(tables, MANIFEST)


# ------------------------------------------------------------------------------------------- several runs
def _judged(seed: int, relay: float, original: float) -> dict:
    """Tables of one run whose judge gives every relay answer ``relay`` and every original answer ``original``; a
    second judge (``judge_alt``) agrees except on the first record."""
    t = example_tables(records=4, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"), layers=3,
                       teacher=False, seed=seed)
    base = t["scores"][t["scores"]["metric"] == "contains"]
    judge = base.assign(metric="judge", value=base["condition"].map({"relay": relay, "original": original}))
    alt = judge.assign(metric="judge_alt", value=judge["value"].where(judge["record_id"] != "r0", 1.0 - judge["value"]))
    return {**t, "scores": pd.concat([t["scores"], judge, alt], ignore_index=True)}


@pytest.fixture
def two_runs(tmp_path, write_run):
    """Two models x two datasets: relay judged right everywhere in the first run, wrong everywhere in the second."""
    up = write_run(tmp_path / "a", _judged(0, 1.0, 0.0), model="/models/model-a", dataset="/data/lme_s.json")
    down = write_run(tmp_path / "b", _judged(1, 0.0, 1.0), model="/models/model-b", dataset="/data/persona.json")
    return up, down


def test_report_of_several_runs_has_the_cross_run_tables(tmp_path, two_runs):
    from typer.testing import CliRunner

    from relaylens.cli import app

    out = tmp_path / "grid.html"
    result = CliRunner().invoke(app, ["report", *map(str, two_runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    # Table 1 over models and datasets: one block per run, the judge's means as fabricated (1.0 / 0.0 per condition)
    rows = re.findall(r"<tr><td>(model-[ab])</td><td>(\w+)</td><td>bm25</td><td>10%</td><td>(\w+)</td>"
                      r'<td class="num">4</td>\s*<td class="num">([0-9.]+) ', html)
    assert sorted(rows) == [("model-a", "lme_s", "original", "0.000"), ("model-a", "lme_s", "relay", "1.000"),
                            ("model-b", "persona", "original", "1.000"), ("model-b", "persona", "relay", "0.000")]
    assert "<th>model</th><th>dataset</th>" in html
    # Table 8 over the grid: two settings, one up and one down
    assert "1 of 2 settings improve (1 positive, 1 negative, 0 zero)" in html
    assert 'id="table-table8"' in html and 'id="table-cross_judge"' in html
    assert "model-a x lme_s" in html and "model-b x persona" in html  # the runs named in the summary
    assert "<section id=\"layer-" not in html and "A cross-run report has no per-layer sections" in html


def test_report_of_several_runs_needs_out(two_runs):
    from typer.testing import CliRunner

    from relaylens.cli import app

    result = CliRunner().invoke(app, ["report", *map(str, two_runs)])
    assert result.exit_code == 2
    assert "pass --out FILE" in result.output and "Traceback" not in result.output
