"""Paired cluster bootstrap: known effects are covered, clusters widen the interval, seeds, NaN pairs, tables."""

from __future__ import annotations

import doctest

import numpy as np
import pandas as pd
import pytest

import relaylens.reporting.bootstrap as bootstrap
from relaylens.reporting.bootstrap import (
    cluster_bootstrap,
    condition_means,
    paired_difference,
    paired_difference_table,
)


def make_scores(n_clusters=60, per_cluster=5, effect=0.1, cluster_sd=0.2, noise_sd=0.2, seed=0, cluster_effect_sd=0.0,
                selectors=("bm25",), budgets=(0.1,)):
    """Long-format scores: original ~ cluster level + noise; relay = original + effect (+ a per-cluster effect)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_clusters):
        level = rng.normal(0, cluster_sd)
        shift = effect + rng.normal(0, cluster_effect_sd)
        for r in range(per_cluster):
            rid = f"c{c}_r{r}"
            for sel in selectors:
                for bud in budgets:
                    base = level + rng.normal(0, noise_sd)
                    for cond, v in (("original", base), ("relay", base + shift + rng.normal(0, noise_sd))):
                        rows.append(dict(record_id=rid, selector=sel, budget=bud, condition=cond, metric="f1",
                                         cluster_id=f"conv{c}", value=v, question_type="t", is_abstention=False))
                        rows.append(dict(record_id=rid, selector=sel, budget=bud, condition=cond, metric="contains",
                                         cluster_id=f"conv{c}", value=float(v > 0), question_type="t",
                                         is_abstention=False))
    return pd.DataFrame(rows)


def test_docstring_examples():
    result = doctest.testmod(bootstrap, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 3 and result.failed == 0


def test_large_known_effect_is_covered_and_excludes_zero():
    df = make_scores(effect=0.3)
    res = paired_difference(df, "f1", n_resamples=4000, seed=1)
    assert res.low <= 0.3 <= res.high and res.low > 0
    assert res.n_clusters == 60 and res.n == 300 and res.n_dropped == 0 and res.level == 0.95
    truth = df[df.metric == "f1"].pivot_table(index="record_id", columns="condition", values="value")
    assert res.mean == pytest.approx((truth["relay"] - truth["original"]).mean())
    flipped = paired_difference(df, "f1", a="original", b="relay", n_resamples=4000, seed=1)
    assert flipped.mean == pytest.approx(-res.mean) and flipped.high < 0


def test_coverage_of_a_known_effect_over_many_datasets():
    hits = 0
    for seed in range(40):
        df = make_scores(n_clusters=30, per_cluster=3, effect=0.05, seed=seed, cluster_effect_sd=0.1)
        res = paired_difference(df, "f1", n_resamples=1000, seed=seed)
        hits += res.low <= 0.05 <= res.high
    assert hits >= 33  # nominal 95%: 38 of 40 expected; percentile intervals run slightly narrow at 30 clusters


def test_clusters_widen_the_interval():
    # the effect varies by conversation, hardly within one: 40 clusters of 10 records are ~40 independent units
    df = make_scores(n_clusters=40, per_cluster=10, effect=0.1, cluster_effect_sd=0.3, noise_sd=0.02)
    clustered = paired_difference(df, "f1", n_resamples=3000)
    naive = paired_difference(df.drop(columns="cluster_id"), "f1", n_resamples=3000)  # every record its own cluster
    assert naive.n_clusters == 400 and clustered.n_clusters == 40
    assert clustered.mean == pytest.approx(naive.mean)
    assert (clustered.high - clustered.low) > 2.0 * (naive.high - naive.low)
    # None cluster ids fall back to the record id
    none = df.assign(cluster_id=None)
    assert paired_difference(none, "f1", n_resamples=3000) == naive


def test_seeded_and_vectorised():
    df = make_scores(n_clusters=20, per_cluster=2)
    a = paired_difference(df, "f1", n_resamples=2000, seed=7)
    assert a == paired_difference(df, "f1", n_resamples=2000, seed=7)
    assert a != paired_difference(df, "f1", n_resamples=2000, seed=8)
    vals = np.arange(10.0)
    small = cluster_bootstrap(vals, np.arange(10), n_resamples=1000, seed=0, max_cells=7)  # forces many chunks
    assert small == cluster_bootstrap(vals, np.arange(10), n_resamples=1000, seed=0)  # chunks continue one stream
    assert small.mean == 4.5 and 1.5 < small.low < 4.5 < small.high < 7.5
    assert cluster_bootstrap(np.array([]), np.array([])).n == 0


def test_unpaired_and_nan_pairs_are_dropped():
    df = make_scores(n_clusters=10, per_cluster=2)
    df.loc[(df.record_id == "c0_r0") & (df.condition == "relay"), "value"] = np.nan  # a judge failure
    df = df[~((df.record_id == "c1_r0") & (df.condition == "original"))]  # a missing condition
    res = paired_difference(df, "f1", n_resamples=500)
    assert res.n == 18 and res.n_dropped == 2


def test_errors():
    df = make_scores(n_clusters=3, per_cluster=1)
    with pytest.raises(ValueError, match="'key_only' has no rows.*original"):
        paired_difference(df, "f1", a="key_only")
    with pytest.raises(ValueError, match="several rows for one pair"):
        paired_difference(df)  # two metrics mixed
    with pytest.raises(ValueError, match="missing"):
        paired_difference(df.drop(columns="budget"), "f1")


def test_tables_by_group():
    df = make_scores(n_clusters=20, per_cluster=2, effect=0.5, selectors=("bm25", "snapkv"), budgets=(0.1, 0.2))
    diff = paired_difference_table(df, "f1", n_resamples=500)
    assert list(diff.columns) == ["selector", "budget", "mean", "low", "high", "n_clusters", "n", "n_dropped"]
    assert len(diff) == 4 and (diff["low"] > 0).all() and (diff["n"] == 40).all()
    means = condition_means(df, "contains", n_resamples=500)
    assert len(means) == 8 and ((means["low"] <= means["mean"]) & (means["mean"] <= means["high"])).all()
    manual = df[(df.metric == "contains") & (df.selector == "bm25") & (df.budget == 0.1) & (df.condition == "relay")]
    row = means[(means.selector == "bm25") & (means.budget == 0.1) & (means.condition == "relay")].iloc[0]
    assert row["mean"] == pytest.approx(manual["value"].mean()) and row["n_clusters"] == 20
