"""Figure 6's per-band paired table: every record is first reduced to one share per band (pp), and the deltas and
win:loss counts match numbers computed by hand here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from relaylens.reporting import figures
from relaylens.reporting.figures.evidence_bands import evidence_band_table
from relaylens.reporting.summaries import win_loss
from relaylens.results.tables import example_tables

CONDITIONS = ("original", "relay", "half_gap")
# six layers: early = 0-1, middle = 2-3, late = 4-5. Share (fraction) per (record, condition), added to layer/100
# in every head so bands differ; hand-set so relay wins on r0 and r1 and loses on r2 in the early band.
BASE = {("r0", "original"): 0.01, ("r0", "relay"): 0.05, ("r0", "half_gap"): 0.02,
        ("r1", "original"): 0.02, ("r1", "relay"): 0.04, ("r1", "half_gap"): 0.02,
        ("r2", "original"): 0.03, ("r2", "relay"): 0.02, ("r2", "half_gap"): 0.03}


@pytest.fixture(params=[("bm25",), ("bm25", "snapkv")], ids=["one_selector", "two_selectors"])
def tables(request):
    t = example_tables(records=3, selectors=request.param, budgets=(0.1,), conditions=CONDITIONS)
    probes = t["probes"]
    probes = probes[probes["metric"].isin(["evidence_share", "replay_gold_share"])
                    & probes["condition"].isin(CONDITIONS)].copy()  # the compaction(alpha) replays: not Figure 6 rows
    # head 1 reads twice head 0's extra share: the record's band value is the mean over heads, then layers
    extra = probes["layer"] / 100.0 * (1 + probes["head"])
    probes["value"] = [BASE[(r, c)] for r, c in zip(probes["record_id"], probes["condition"])] + extra
    return {"answers": t["answers"], "scores": t["scores"], "probes": probes}


def test_band_deltas_and_counts_match_hand_computed_ones(tables):
    table = evidence_band_table(tables)
    pooled = table[(table["selector"] == "all") & (table["probe_point"] == "question_final")
                   & (table["quantity"] == "forward:evidence_share")].set_index(["condition", "band"])
    assert list(pooled.index) == [(c, b) for c in ("relay", "half_gap") for b in ("early", "middle", "late")]
    n_selectors = tables["answers"]["selector"].nunique()
    relay = [BASE[(r, "relay")] - BASE[(r, "original")] for r in ("r0", "r1", "r2")]  # the layer terms cancel
    row = pooled.loc[("relay", "early")]
    assert row["delta_pp"] == pytest.approx(100 * np.mean(relay))
    assert (row["wins"], row["losses"], row["n"]) == (2 * n_selectors, 1 * n_selectors, 3 * n_selectors)
    assert row["delta_low"] <= row["delta_pp"] <= row["delta_high"]
    # original's early band: mean over records of BASE + mean over layers 0-1 of mean over heads of layer/100*(1+h)
    early_extra = np.mean([layer / 100 * (1 + h) for layer in (0, 1) for h in (0, 1)])
    expected = 100 * (np.mean([BASE[(r, "original")] for r in ("r0", "r1", "r2")]) + early_extra)
    assert row["original_pp"] == pytest.approx(expected)
    assert row["value_pp"] - row["original_pp"] == pytest.approx(row["delta_pp"])
    half = pooled.loc[("half_gap", "late")]
    assert (half["wins"], half["losses"]) == (n_selectors, 0)  # r0 up by 1 pp, r1 and r2 level
    assert half["delta_pp"] == pytest.approx(1.0 / 3)
    replay = table[table["quantity"] == "replay:replay_gold_share"]
    assert set(replay["probe_point"]) == {"question_final"}  # phase replay exists at the final question token only
    per_selector = table[table["selector"] != "all"]
    assert set(per_selector["selector"]) == (set(tables["answers"]["selector"]) if n_selectors > 1 else set())


def test_drawn_with_figure6(tables):
    manifest = {"config": {"spec": {"figures": ["figure6"]}}}
    assert "evidence_bands" in figures.select_figures(tables, manifest)
    no_probes = {**tables, "probes": tables["probes"].iloc[:0]}
    assert "evidence_bands" not in figures.select_figures(no_probes, manifest)


def test_win_loss_skips_incomplete_pairs():
    rows = pd.DataFrame({"record_id": ["a", "a", "b", "c", "c"], "selector": "s", "budget": 0.1,
                         "condition": ["original", "relay", "relay", "original", "relay"], "metric": "m",
                         "value": [0.0, 1.0, 5.0, 2.0, 2.0]})
    counts = win_loss(rows, []).iloc[0]
    assert (counts["wins"], counts["losses"], counts["n"]) == (1, 0, 2)  # b has no original; c is a tie
