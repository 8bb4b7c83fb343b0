"""Paired tables under judge failures and odd cluster ids: Table 8 and Table 2 print the condition means over the
valid pairs (they reconcile with the paired delta), a setting without a valid pair is not counted as a "zero"
setting, settings on fewer than 10 clusters are flagged, and "missing cluster" is one rule in every code path."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from relaylens.reporting.bootstrap import cluster_ids, paired_difference
from relaylens.reporting.crossrun import paired_settings_table, settings_count
from relaylens.reporting.figures import build
from relaylens.reporting.figures.paired_settings import table8_lines
from relaylens.reporting.summaries import paired_deltas

NAN = float("nan")


def scores(pairs, selector="bm25", metric="judge", question_type="t", clusters=None):
    """Long rows from per-record ``(original, relay)`` values (NaN: a failed judgement)."""
    rows = []
    for i, values in enumerate(pairs):
        cid = f"c{i}" if clusters is None else clusters[i]
        for cond, value in zip(("original", "relay"), values):
            rows.append(dict(record_id=f"{question_type}_{selector}_{i}", selector=selector, budget=0.1, condition=cond,
                             question_type=question_type, is_abstention=False, cluster_id=cid, metric=metric,
                             value=value))
    return pd.DataFrame(rows)


# 12 records; the judge failed on relay for three records whose original was 0 and on original for one with relay 1
FAILING = [(1, 1), (0, 1), (1, 1), (0, 0), (1, 1), (0, 1), (1, 0), (0, NAN), (0, NAN), (0, NAN), (NAN, 1), (1, 1)]


def test_table8_means_are_over_the_valid_pairs_and_reconcile_with_the_delta():
    t8 = paired_settings_table(scores(FAILING), "judge", n_resamples=500).iloc[0]
    valid = [p for p in FAILING if not any(math.isnan(v) for v in p)]
    assert t8["n"] == len(valid) == 8 and t8["n_dropped"] == 4
    assert t8["original"] == pytest.approx(np.mean([o for o, _ in valid]))
    assert t8["relay"] == pytest.approx(np.mean([r for _, r in valid]))
    assert t8["relay"] - t8["original"] == pytest.approx(t8["delta"])


def test_setting_without_a_valid_pair_is_shown_but_not_counted():
    both = pd.concat([scores([(0, 1)] * 12, selector="bm25"), scores([(0, NAN), (NAN, 1)] * 6, selector="snapkv")])
    t8 = paired_settings_table(both, "judge", n_resamples=200).set_index("selector")
    assert t8.loc["snapkv", "n"] == 0 and t8.loc["snapkv", "sign"] == "" and t8.loc["snapkv", "flag"] == "no valid pair"
    assert math.isnan(t8.loc["snapkv", "original"]) and math.isnan(t8.loc["snapkv", "delta"])
    count = settings_count(t8.reset_index())
    assert count.startswith("1 of 1 settings improve (1 positive, 0 negative, 0 zero)"), count
    assert "1 setting(s) without a valid pair not counted" in count


def test_table2_means_are_over_the_valid_pairs():
    rows = scores(FAILING, metric="f1", question_type="longbook_qa_eng", selector="snapkv")
    table = build("table2", {"scores": rows}).iloc[0]
    valid = [p for p in FAILING if not any(math.isnan(v) for v in p)]
    assert table["n"] == len(valid)
    assert table["original"] == pytest.approx(np.mean([o for o, _ in valid]))
    assert table["relay"] == pytest.approx(np.mean([r for _, r in valid]))
    assert table["relay"] - table["original"] == pytest.approx(table["delta"])
    for col in ("original", "relay"):
        assert table[f"{col}_low"] <= table[col] <= table[f"{col}_high"]


def test_table2_task_without_a_valid_pair_has_no_means():
    rows = scores([(0, NAN), (NAN, 1)] * 6, metric="f1", question_type="longbook_qa_eng")
    table = build("table2", {"scores": rows}).iloc[0]
    assert table["n"] == 0 and math.isnan(table["original"]) and table["flag"] == "no valid pair"


@pytest.mark.parametrize("n_clusters, flagged", [(1, True), (3, True), (9, True), (10, False), (24, False)])
def test_few_clusters_are_flagged_in_table8_and_its_summary(n_clusters, flagged):
    pairs = [(i % 2, 1) for i in range(24)]
    clusters = [f"book{i % n_clusters}" for i in range(24)]
    rows = scores(pairs, clusters=clusters)
    t8 = paired_settings_table(rows, "judge", n_resamples=300).iloc[0]
    assert t8["n_clusters"] == n_clusters and bool(t8["flag"]) is flagged
    count = settings_count(pd.DataFrame([t8]))
    assert ("fewer than 10 clusters" in count) is flagged
    (line,) = table8_lines(rows, ["judge"])
    assert (f"only {n_clusters} cluster" in line[1] and "(fewer than 10): interval unreliable" in line[1]) is flagged
    table2 = build("table2", {"scores": scores(pairs, clusters=clusters, metric="f1",
                                              question_type="longbook_qa_eng")}).iloc[0]
    assert bool(table2["flag"]) is flagged


@pytest.mark.parametrize("missing", [None, NAN, "None", "", "  ", " None ", "nan"])
def test_missing_cluster_is_one_rule_in_bootstrap_and_summaries(missing):
    """Each record with a missing cluster id is its own cluster in every code path (never one shared cluster)."""
    pairs = [(i % 2, 1) for i in range(12)]
    rows = scores(pairs, metric="f1", clusters=["book"] * 4 + [missing] * 8)
    assert len(set(cluster_ids(rows))) == 1 + 8
    res = paired_difference(rows, "f1")
    deltas = paired_deltas(rows, by=["selector", "budget"], metrics=["f1"]).iloc[0]
    assert res.n_clusters == 9
    assert (deltas["mean"], deltas["low"], deltas["high"]) == pytest.approx((res.mean, res.low, res.high))
    t8 = paired_settings_table(rows, "f1", n_resamples=10_000).iloc[0]
    assert t8["n_clusters"] == 9 and (t8["delta_low"], t8["delta_high"]) == pytest.approx((res.low, res.high))


def test_paired_deltas_without_a_cluster_column_uses_the_records():
    rows = scores([(i % 2, 1) for i in range(12)], metric="f1").drop(columns="cluster_id")
    deltas = paired_deltas(rows, by=["selector"], metrics=["f1"]).iloc[0]
    res = paired_difference(rows, "f1")
    assert res.n_clusters == 12
    assert (deltas["mean"], deltas["low"], deltas["high"]) == pytest.approx((res.mean, res.low, res.high))


def test_cross_run_labels_use_the_same_missing_rule(tmp_path):
    from relaylens.reporting.crossrun import load_runs
    from relaylens.results.store import RunStore, UnitKey, build_manifest

    runs = []
    for model in ("m1", "m2"):
        data = tmp_path / f"{model}.json"
        data.write_text("[]")
        store = RunStore.create_or_open(tmp_path / model, build_manifest("main_table", {}, model, "hash", data))
        rows = scores([(0, 1), (1, 1)], clusters=[" None ", "book"])
        for rid, g in rows.groupby("record_id"):
            store.write_unit(UnitKey(rid, "bm25", 0.1), [], g.to_dict("records"), [])
        store.consolidate()
        runs.append(tmp_path / model)
    tables, _ = load_runs(runs)
    cid = tables["scores"]["cluster_id"]
    assert cid.isna().sum() == 4 and set(cid.dropna()) == {"m1|m1|book", "m2|m2|book"}
