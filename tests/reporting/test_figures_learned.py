"""The learned-geometry and positional-sensitivity entries from constructed tables (no model): they build at every
sharing level, their numbers are the tables', they are byte-stable, and they say why when the tables cannot
support them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from relaylens.reporting import figures, plots, summaries
from relaylens.reporting.figures.learned_geometry import final_parameters, learned_table
from relaylens.reporting.figures.positional_sensitivity import sensitivity_grids
from relaylens.results.tables import TABLES, example_tables

LAYERS, HEADS, STEPS = 4, 2, 6


@pytest.fixture(autouse=True)
def fast_bootstrap(monkeypatch):
    monkeypatch.setattr(summaries, "N_RESAMPLES", 300)


def _tables(sharing: str = "layer", seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tables = example_tables(records=5, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay", "learned"),
                            replay=(), layers=LAYERS, heads=HEADS, seed=seed)
    key = dict(record_id="training", selector="bm25", budget=0.1)
    rows = []
    cells = {"global": [(-1, -1)], "layer": [(l, -1) for l in range(LAYERS)],
             "head": [(l, h) for l in range(LAYERS) for h in range(HEADS)]}[sharing]
    for step in range(STEPS + 1):
        for layer, head in cells:
            for name, value in (("b", 1 + 0.5 * step * (layer + 1)), ("s", 1 - 0.05 * step), ("alpha", 1 - 0.1 * step)):
                rows.append(key | dict(step=step, layer=layer, head=head, metric=name, value=value))
        if step < STEPS:
            rows.append(key | dict(step=step, layer=-1, head=-1, metric="train_loglik", value=-3 + 0.1 * step))
        if step % 3 == 0:
            rows.append(key | dict(step=step, layer=-1, head=-1, metric="test_loglik", value=-3.2 + 0.05 * step))
            rows.append(key | dict(step=step, layer=-1, head=-1, metric="train_all_loglik", value=-3.1 + 0.08 * step))
    tables["geometry"] = pd.DataFrame(rows, columns=TABLES["geometry"])
    scores, probes = tables["scores"], tables["probes"]
    extra_scores, extra_probes = [], []
    for (rid, sel, budget, cond), g in scores.groupby(["record_id", "selector", "budget", "condition"]):
        base = g.iloc[0].to_dict()
        value = -3.0 + {"original": -0.5, "relay": 0.0, "learned": 0.2}[cond] + rng.normal(0, 0.05)
        extra_scores.append(base | dict(metric="answer_loglik", value=value))
        for layer in range(LAYERS):
            for head in range(HEADS):
                for metric in ("positional_sensitivity_b", "positional_sensitivity_s"):
                    extra_probes.append(dict(record_id=rid, selector=sel, budget=budget, condition=cond,
                                             probe_point="question_final", source="forward", layer=layer, head=head,
                                             metric=metric, value=float(rng.normal(0, 0.1)) + 0.01 * layer))
    tables["scores"] = pd.concat([scores, pd.DataFrame(extra_scores)], ignore_index=True)
    tables["probes"] = pd.concat([probes, pd.DataFrame(extra_probes, columns=TABLES["probes"])], ignore_index=True)
    return tables


@pytest.mark.parametrize("sharing", ["global", "layer", "head"])
def test_entries_build_at_every_sharing_level(sharing):
    tables = _tables(sharing)
    for name in ("learned_geometry", "positional_sensitivity"):
        assert figures.supported(tables, name) is None
        fig = figures.build(name, tables)
        assert isinstance(fig, Figure) and any(ax.lines or ax.collections or ax.images for ax in fig.axes)
    table = figures.build("learned_table", tables)
    assert list(table["metric"]) == ["answer_loglik", "contains", "f1", "evidence_share"]
    params = final_parameters(tables["geometry"])
    assert set(params["metric"]) == {"b", "s", "alpha"} and (params["metric"] == "b").sum() == {
        "global": 1, "layer": LAYERS, "head": LAYERS * HEADS}[sharing]


def test_learned_table_numbers_are_the_tables():
    tables = _tables()
    table = learned_table(tables).set_index("metric")
    scores = tables["scores"]
    ll = scores[scores["metric"] == "answer_loglik"].groupby("condition")["value"].mean()
    assert table.loc["answer_loglik", "learned"] == pytest.approx(ll["learned"])
    assert table.loc["answer_loglik", "vs_relay"] == pytest.approx(ll["learned"] - ll["relay"])
    low, mid, high = (table.loc["answer_loglik", c] for c in ("vs_relay_low", "vs_relay", "vs_relay_high"))
    assert low <= mid <= high
    grids = sensitivity_grids(tables["probes"])
    probes = tables["probes"]
    one = probes[(probes["condition"] == "relay") & (probes["metric"] == "positional_sensitivity_b")
                 & (probes["layer"] == 2) & (probes["head"] == 1)]["value"].mean()
    assert grids[("relay", "positional_sensitivity_b")].shape == (LAYERS, HEADS)
    assert grids[("relay", "positional_sensitivity_b")][2, 1] == pytest.approx(one)


def test_entries_are_byte_stable(tmp_path):
    tables = _tables("head")
    for name in ("learned_geometry", "positional_sensitivity"):
        paths = []
        for attempt in range(2):
            with plots.style():
                paths.append(plots.save_figure(figures.build(name, tables), tmp_path / f"{attempt}" / name,
                                               ["png", "svg"]))
        for first, second in zip(*paths):
            assert first.read_bytes() == second.read_bytes(), first.name


def test_unsupported_tables_say_why():
    tables = example_tables(records=2, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    assert "learned_geometry writes it" in figures.supported(tables, "learned_geometry")
    assert "no positional sensitivity readouts" in figures.supported(tables, "positional_sensitivity")
    manifest = {"config": {"spec": {"figures": ["learned_geometry", "learned_table", "positional_sensitivity"]}}}
    assert figures.select_figures(_tables(), manifest) == ["learned_geometry", "learned_table",
                                                           "positional_sensitivity"]
