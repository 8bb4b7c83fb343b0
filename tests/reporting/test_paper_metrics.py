"""Metrics everywhere: a judge that favours relay shows its gain in Table 1, Table 6, Table 8, Figures 3-5 and the
report; contains/F1 stay the fallback with a note; footers state evidence retention; several runs make one grid."""

from __future__ import annotations

import pandas as pd
import pytest

from relaylens.reporting import figures, summaries
from relaylens.reporting.figures.registry import footer_lines, prepare_tables
from relaylens.results.tables import example_tables


@pytest.fixture(autouse=True)
def fast_bootstrap(monkeypatch):
    monkeypatch.setattr(summaries, "N_RESAMPLES", 200)


def _judged(tables: dict) -> dict:
    """``tables`` plus a judge verdict per answer: correct exactly under relay (a judge that favours relay)."""
    scores = tables["scores"]
    base = scores[scores["metric"] == "f1"].copy()
    judge = base.assign(metric="judge", value=(base["condition"] == "relay").astype(float))
    return dict(tables, scores=pd.concat([scores, judge], ignore_index=True))


@pytest.fixture(scope="module")
def judged():
    grid = example_tables(records=4, selectors=("bm25", "snapkv"), budgets=(0.1, 0.2),
                          conditions=("original", "relay", "key_only", "score_order", "random_order(0)"),
                          replay=(), layers=3, teacher=False)
    return prepare_tables(_judged(grid))


def test_the_judge_is_the_default_metric_and_contains_the_fallback(judged):
    assert judged["metrics"] == ("judge",) and judged["metric_note"] == ""
    plain = prepare_tables(example_tables(records=2, conditions=("original", "relay"), replay=(), layers=3))
    assert plain["metrics"] == ("contains", "f1") and "paper's metric" in plain["metric_note"]
    assert prepare_tables(judged, "f1")["metrics"] == ("f1",)


@pytest.mark.parametrize("name", ["table1", "table6"])
def test_tables_show_the_judged_gain(judged, name):
    table = figures.build(name, judged)
    relay = table[table["condition"] == "relay"]
    assert "judge" in table.columns and "contains" not in table.columns
    assert (relay["judge"] == 1.0).all() and (relay["judge_delta"] == 1.0).all()


def test_table8_is_the_papers_paired_settings_table(judged):
    t8 = figures.build("table8", judged)
    assert len(t8) == 4 and (t8["delta"] == 1.0).all() and set(t8["sign"]) == {"+"}
    assert t8.attrs["note"].startswith("judge: 4 of 4 settings improve (4 positive, 0 negative, 0 zero)")


@pytest.mark.parametrize("name", ["figure3", "figure4", "figure5"])
def test_figures_plot_the_judge(judged, name):
    fig = figures.build(name, judged)
    labels = {ax.get_ylabel() for ax in fig.axes} | {ax.get_title() for ax in fig.axes}
    assert any("judge" in text for text in labels), labels
    assert not any("contains" in text for text in labels)
    footer = fig._supxlabel.get_text()
    assert "gold evidence retained in" in footer


def test_report_shows_metric_retention_table8_and_skipped(judged):
    from relaylens.reporting.report import render_report

    skipped = pd.DataFrame([{"record_id": "long1", "selector": "bm25", "budget": 0.1, "reason": "too_long",
                             "history_length": 9000, "detail": "record long1: history of 9000 tokens exceeds ..."}])
    html = render_report(dict(judged, skipped=skipped), {"analysis": "main_table"}, figure_names=[])
    assert "judge" in html and "gold evidence retained in" in html
    assert "settings improve" in html and "long1: too_long" in html


def test_footer_lines_state_retention_per_selector_and_budget(judged):
    lines = footer_lines(judged)
    assert lines and all(f"{s} @ {b:g}" in lines[0] for s in ("bm25", "snapkv") for b in (0.1, 0.2))


def test_figure6_draws_each_selector(judged):
    fig = figures.build("figure6", judged)
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "bm25" in titles and "snapkv" in titles


def test_retained_only_restricts_probes():
    tables = example_tables(records=4, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"),
                            replay=(), layers=3, teacher=False)
    answers = tables["answers"].copy()
    first = answers["record_id"] == answers["record_id"].iloc[0]
    answers["gold_units_total"], answers["gold_units_kept"] = 1, 1  # every record's evidence kept ...
    answers.loc[first, "gold_units_kept"] = 0  # ... except the first's
    restricted = prepare_tables(dict(tables, answers=answers), retained_only=True)
    assert answers["record_id"].iloc[0] not in set(restricted["probes"]["record_id"])
    assert restricted["probes"]["record_id"].nunique() == tables["probes"]["record_id"].nunique() - 1
