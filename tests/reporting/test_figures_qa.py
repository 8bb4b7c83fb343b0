"""Table 2 (InfiniteBench) and Table 7 (FINCH comparison) from hand-made score tables with hand-computed means."""

from __future__ import annotations

import pandas as pd
import pytest

from relaylens.reporting.figures import REGISTRY, build, supported
from relaylens.reporting.figures.finch_comparison import FINCH_COORDINATES
from relaylens.reporting.figures.infinitebench import TASK_METRICS


def _rows(record_ids, selector, condition, metric, values, question_type="multi-session"):
    return [{"record_id": r, "selector": selector, "budget": 0.1, "condition": condition,
             "question_type": question_type,
             "is_abstention": False, "cluster_id": r, "metric": metric, "value": float(v)}
            for r, v in zip(record_ids, values)]


def test_finch_coordinates_match_the_selector():
    from relaylens.selectors import Finch

    assert FINCH_COORDINATES == Finch.coordinates


def test_table2_by_hand():
    rows = []
    dia = [f"longdialogue_qa_eng_{i}" for i in range(4)]
    qa = [f"longbook_qa_eng_{i}" for i in range(3)]
    rows += _rows(dia, "snapkv", "original", "contains", [1, 0, 0, 1], "longdialogue_qa_eng")
    rows += _rows(dia, "snapkv", "relay", "contains", [1, 1, 0, 1], "longdialogue_qa_eng")
    rows += _rows(dia, "snapkv", "original", "f1", [0.3, 0.3, 0.3, 0.3], "longdialogue_qa_eng")  # not the task metric
    rows += _rows(qa, "snapkv", "original", "f1", [0.5, 0.0, 1.0], "longbook_qa_eng")
    rows += _rows(qa, "snapkv", "relay", "f1", [0.5, 0.5, 0.5], "longbook_qa_eng")
    skipped = pd.DataFrame({"record_id": ["longbook_qa_eng_9", "longbook_qa_eng_9"], "selector": ["snapkv"] * 2,
                            "budget": [0.1, 0.2], "reason": ["too_long"] * 2})
    table = build("table2", {"scores": pd.DataFrame(rows), "skipped": skipped})
    assert table["task"].tolist() == ["longdialogue_qa_eng", "longbook_qa_eng"]
    dia_row, qa_row = table.iloc[0], table.iloc[1]
    assert dia_row["metric"] == "contains" and dia_row["n"] == 4 and dia_row["label"] == "En.Dia"
    assert (dia_row["original"], dia_row["relay"], dia_row["delta"]) == pytest.approx((0.5, 0.75, 0.25))
    assert qa_row["metric"] == "f1" and qa_row["n"] == 3 and qa_row["skipped"] == 1 and dia_row["skipped"] == 0
    assert (qa_row["original"], qa_row["relay"], qa_row["delta"]) == pytest.approx((0.5, 0.5, 0.0))
    for _, row in table.iterrows():
        for col in ("original", "relay", "delta"):
            assert row[f"{col}_low"] <= row[col] <= row[f"{col}_high"]
    assert set(TASK_METRICS.values()) == {"contains", "choice_accuracy", "f1"}


def test_table2_needs_infinitebench_rows():
    scores = pd.DataFrame(_rows(["a", "b"], "snapkv", "original", "contains", [1, 0]))
    assert "InfiniteBench" in supported({"scores": scores}, "table2")
    assert REGISTRY["table2"].kind == "table" and REGISTRY["table7"].kind == "table"


def test_table7_by_hand():
    ids = ["r0", "r1", "r2", "r3"]
    rows = []
    rows += _rows(ids, "finch", FINCH_COORDINATES, "f1", [0.5, 0.5, 0.0, 1.0])
    rows += _rows(ids, "finch", "relay", "f1", [0.5, 0.5, 0.0, 1.0])
    rows += _rows(ids, "finch", "original", "f1", [0.0, 0.5, 0.0, 0.5])
    rows += _rows(ids, "bm25", "relay", "f1", [1.0, 0.5, 0.5, 1.0])
    rows += _rows(ids, "bm25", "rank_sync", "f1", [0.0, 0.0, 0.0, 0.0])  # not bm25's row: relay is
    rows += _rows(ids, "bm25", "original", "f1", [0.5, 0.5, 0.5, 0.5])
    rows += _rows(ids, "chunkkv", "relay", "f1", [0.0, 0.5, 0.0, 1.0])
    table = build("table7", {"scores": pd.DataFrame(rows)})
    assert table["selector"].tolist() == ["finch", "bm25", "chunkkv"]
    assert table["coordinates"].tolist() == [FINCH_COORDINATES, "relay", "relay"]
    finch, bm25, chunk = (table.iloc[i] for i in range(3))
    assert finch["score"] == pytest.approx(0.5) and pd.isna(finch["vs_finch"])
    assert finch["original"] == pytest.approx(0.25)
    assert bm25["score"] == pytest.approx(0.75) and bm25["vs_finch"] == pytest.approx(0.25) and bm25["n"] == 4
    assert bm25["original"] == pytest.approx(0.5)
    assert chunk["vs_finch"] == pytest.approx(-0.125) and pd.isna(chunk["original"])
    assert bm25["vs_finch_low"] <= bm25["vs_finch"] <= bm25["vs_finch_high"]


def test_table7_needs_finch():
    scores = pd.DataFrame(_rows(["a"], "bm25", "relay", "f1", [1.0]))
    assert "FINCH" in supported({"scores": scores}, "table7")


def test_report_shows_paper_tables():
    from relaylens.reporting.report import render_report

    ids = ["r0", "r1"]
    rows = _rows(ids, "finch", FINCH_COORDINATES, "f1", [0.5, 0.0]) + _rows(ids, "bm25", "relay", "f1", [1.0, 0.5])
    rows += _rows(ids, "finch", "original", "f1", [0.0, 0.0]) + _rows(ids, "bm25", "original", "f1", [0.0, 0.5])
    html = render_report({"scores": pd.DataFrame(rows)},
                         {"analysis": "finch_comparison"}, figure_names=["table7"])
    assert '<table id="table-table7">' in html and "0.500 [" in html
