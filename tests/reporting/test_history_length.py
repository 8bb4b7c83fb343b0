"""Gain vs history length: the table's paired differences and win:loss counts against hand-computed ones, the
evidence share averaged per record before pairing, and the refusal of a single history length."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from relaylens.reporting.figures import REGISTRY
from relaylens.reporting.figures.history_length import history_length_table, needs_history_lengths
from relaylens.results.tables import example_tables

LENGTHS = (2048, 4096, 8192)


def _grid(contains: dict[int, dict[tuple[str, str], float]], share: dict[int, float]):
    """Three runs (one per history length) of 6 records x (original, relay): ``contains`` by (record, condition)
    overrides (default 0), evidence share of relay = ``share[length]`` on layer 0 and 0 on layer 1, original 0."""
    parts = []
    for length in LENGTHS:
        t = example_tables(records=6, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
        label = dict(model="qwen", dataset=f"lme_{length}")
        answers = t["answers"].assign(history_length=length, cluster_id=t["answers"]["record_id"], **label)
        scores = t["scores"][t["scores"]["metric"] == "contains"].copy()
        scores["value"] = [contains[length].get((r, c), 0.0) for r, c in zip(scores.record_id, scores.condition)]
        scores = scores.assign(cluster_id=scores["record_id"], **label)
        probes = t["probes"]
        probes = probes[(probes.metric == "evidence_share") & (probes.source == "forward")
                        & (probes.probe_point == "question_final")].copy()
        probes["value"] = np.where((probes.condition == "relay") & (probes.layer == 0), share[length], 0.0)
        parts.append({"answers": answers, "scores": scores, "probes": probes.assign(**label)})
    tables = {n: pd.concat([p[n] for p in parts], ignore_index=True) for n in parts[0]}
    return tables | {"metrics": ["contains"]}


def _contains():
    return {2048: {("r0", "relay"): 1.0},                                              # +1/6, 1 win
            4096: {("r0", "relay"): 1.0, ("r1", "relay"): 1.0, ("r2", "original"): 1.0},  # +1/6, 2 wins 1 loss
            8192: {(f"r{i}", "relay"): 1.0 for i in range(4)}}                          # +4/6, 4 wins


def test_paired_differences_and_win_loss_counts_match_hand_computed_ones():
    tables = _grid(_contains(), {2048: 0.1, 4096: 0.2, 8192: 0.4})
    table = history_length_table(tables)
    acc = table[table.quantity == "contains"].set_index("history_tokens")
    assert list(acc.index) == list(LENGTHS)
    assert acc.loc[2048, "delta"] == pytest.approx(1 / 6) and (acc.loc[2048, "wins"], acc.loc[2048, "losses"]) == (1, 0)
    assert acc.loc[4096, "delta"] == pytest.approx(1 / 6) and (acc.loc[4096, "wins"], acc.loc[4096, "losses"]) == (2, 1)
    assert acc.loc[8192, "delta"] == pytest.approx(4 / 6) and acc.loc[8192, "n"] == 6
    assert (acc["delta_low"] <= acc["delta"]).all() and (acc["delta"] <= acc["delta_high"]).all()
    share = table[table.quantity == "evidence_share_pp"].set_index("history_tokens")  # percentage points
    layers = tables["probes"]["layer"].nunique()  # relay puts the share on layer 0 only: the per-record mean divides
    for length, value in {2048: 0.1, 4096: 0.2, 8192: 0.4}.items():
        assert share.loc[length, "delta"] == pytest.approx(100 * value / layers)
        assert share.loc[length, "wins"] == 6 and share.loc[length, "delta_low"] == pytest.approx(100 * value / layers)


def test_the_figure_draws_one_point_per_length_and_quantity():
    tables = _grid(_contains(), {2048: 0.1, 4096: 0.2, 8192: 0.4})
    fig = REGISTRY["history_length"].build(tables)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 2  # contains, evidence share
    for ax in panels:
        (bars,) = ax.containers  # one series (model, selector, budget): its error bars
        xs, ys = bars.lines[0].get_data()
        assert len(xs) == 3 and np.all(np.diff(xs) > 0) and np.all(np.isfinite(ys))


def test_one_history_length_is_refused_with_the_command_that_makes_the_curve():
    tables = _grid(_contains(), {2048: 0.1, 4096: 0.2, 8192: 0.4})
    one = {n: (df[df["dataset"] == "lme_2048"] if isinstance(df, pd.DataFrame) else df) for n, df in tables.items()}
    reason = needs_history_lengths(one)
    assert reason is not None and "single history length" in reason and "relaylens figures" in reason
    assert needs_history_lengths(tables) is None
