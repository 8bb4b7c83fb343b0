"""Figure 5's numbers: RandomMean is the per-record mean over the seeds, and every mean and paired difference
matches numbers computed by hand here."""

from __future__ import annotations

import numpy as np
import pytest

from relaylens.reporting import figures
from relaylens.reporting.figures.ordering import ordering_table
from relaylens.results.tables import example_tables

CONDITIONS = ("original", "relay", "score_order", "reverse_order", "random_order(0)", "random_order(1)")
# contains per record r0..r3 and condition (hand-set)
CONTAINS = {"original": [0, 0, 0, 1], "relay": [1, 1, 0, 1], "score_order": [1, 0, 0, 1],
            "reverse_order": [0, 0, 0, 0], "random_order(0)": [1, 0, 1, 1], "random_order(1)": [0, 0, 1, 1]}
# evidence share at the final question token, the same on every layer and head (fraction)
SHARE = {"original": 0.01, "relay": 0.03, "score_order": 0.02, "reverse_order": 0.02, "random_order(0)": 0.04,
         "random_order(1)": 0.02}


@pytest.fixture
def tables():
    t = example_tables(records=4, selectors=("bm25",), budgets=(0.1,), conditions=CONDITIONS)
    scores = t["scores"][t["scores"]["metric"] == "contains"].copy()
    scores["value"] = [float(CONTAINS[c][int(r[1:])]) for r, c in zip(scores.record_id, scores.condition)]
    probes = t["probes"]
    probes = probes[(probes.metric == "evidence_share") & (probes.source == "forward")
                    & (probes.probe_point == "question_final")].copy()
    probes["value"] = probes["condition"].map(SHARE)
    return {"answers": t["answers"], "scores": scores, "probes": probes, "metrics": ["contains"]}


def test_means_and_paired_differences_match_hand_computed_ones(tables):
    table = ordering_table(tables).set_index(["quantity", "condition"])
    acc = table.loc["contains"]
    assert list(acc.index) == ["original", "relay", "score_order", "reverse_order", "RandomMean"]
    random_mean = np.mean([CONTAINS["random_order(0)"], CONTAINS["random_order(1)"]], axis=0)  # [0.5, 0, 1, 1]
    assert acc.loc["RandomMean", "mean"] == pytest.approx(random_mean.mean())
    assert acc.loc["relay", "mean"] == 0.75 and acc.loc["original", "mean"] == 0.25
    assert acc.loc["RandomMean", "vs_original"] == pytest.approx(random_mean.mean() - 0.25)
    assert acc.loc["relay", "vs_original"] == pytest.approx(0.5)
    assert acc.loc["RandomMean", "vs_relay"] == pytest.approx(random_mean.mean() - 0.75)
    assert acc.loc["reverse_order", "vs_relay"] == pytest.approx(-0.75)
    assert np.isnan(acc.loc["original", "vs_original"]) and np.isnan(acc.loc["relay", "vs_relay"])
    assert (acc["mean_low"] <= acc["mean"] + 1e-12).all() and (acc["mean"] <= acc["mean_high"] + 1e-12).all()
    share = table.loc["evidence_share_pp"]  # percentage points; a constant shift has a degenerate interval
    assert share.loc["RandomMean", "mean"] == pytest.approx(3.0)
    assert share.loc["relay", "vs_original"] == pytest.approx(2.0)
    assert share.loc["RandomMean", "vs_relay"] == pytest.approx(0.0, abs=1e-9)
    assert share.loc["score_order", "vs_relay_low"] == pytest.approx(-1.0)
    assert "random_order(0)" not in set(table.index.get_level_values("condition"))


def test_drawn_with_figure5(tables):
    manifest = {"config": {"spec": {"figures": ["figure5"]}}}
    assert figures.select_figures(tables, manifest) == ["figure5", "ordering_table"]
    no_orders = {**tables, "scores": tables["scores"][tables["scores"].condition.isin(["original", "relay"])]}
    assert "ordering_table" not in figures.select_figures(no_orders, {})
