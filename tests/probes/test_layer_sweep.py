"""The layer_scope analysis and the per-layer causal sweep, end to end on a tiny Gemma-3 (two layer types)."""

from __future__ import annotations

import json

import pytest

from relaylens.probes.layer_sweep import LOGPROB_METRIC, SWEEP_SOURCE, sweep_conditions
from relaylens.reporting.figures.layer_scope import sweep_kind
from relaylens.results.store import load_tables


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    from relaylens.analyses.layer_scope import SPEC
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("layer_scope")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=5, history_tokens=800)))
    spec = SPEC.replace(max_new_tokens=2, budgets=(0.3,), sweep="layers")
    config = RunConfig(model="tiny-gemma3", data=str(data), limit=2, out=str(root / "run"), window_size=4)
    run_dir = run_analysis(spec, config, progress=False, model_and_tokenizer=(tiny_model("gemma3"), tiny_tokenizer()))
    return load_tables(run_dir), json.loads((run_dir / "manifest.json").read_text())


def test_conditions_expand_per_layer_type(sweep_run):
    tables, _ = sweep_run
    assert sorted(tables["answers"]["condition"].unique()) == sorted([
        "original", "relay", "relay@band=early", "relay@band=middle", "relay@band=late",
        "relay@layer_type=sliding_attention", "relay@layer_type=full_attention", "key_only"])


def test_sweep_rows_cover_every_layer_and_are_recorded(sweep_run):
    tables, manifest = sweep_run
    assert manifest["config"]["spec"]["sweep"] == "layers"
    logprob = tables["scores"][tables["scores"]["metric"] == LOGPROB_METRIC]
    expected = [c.label for c in sweep_conditions(3)]
    assert sorted(logprob["condition"].unique()) == sorted(expected)
    assert bool((logprob["value"] <= 0).all()) and len(logprob) == 2 * len(expected)
    kinds = {sweep_kind(c) for c in expected} - {None}
    assert kinds == {("single", 0), ("single", 1), ("single", 2), ("cumulative", 1), ("cumulative", 2)}
    sweep = tables["probes"][tables["probes"]["source"] == SWEEP_SOURCE]
    assert set(sweep["metric"]) == {"evidence_share"} and set(sweep["layer"]) == {0, 1, 2}
    # answers of the sweep conditions are not generated: accuracy tables see only the analysis's conditions
    assert not set(tables["answers"]["condition"]) & (set(expected) - {"original"})


def test_sweep_ends_exactly_at_the_unscoped_conditions(sweep_run):
    """relay in layers 0..L-1 is relay everywhere, and the sweep's original is the analysis's original: the same
    coordinates, so their forward evidence shares must agree exactly with the main pass's."""
    tables, _ = sweep_run
    probes = tables["probes"]
    keys = ["record_id", "layer", "head"]
    forward = probes[(probes["source"] == "forward") & (probes["probe_point"] == "question_final")
                     & (probes["metric"] == "evidence_share")]
    sweep = probes[probes["source"] == SWEEP_SOURCE]
    for sweep_label, main_label in (("relay@layers=0-2", "relay"), ("original", "original")):
        a = sweep[sweep["condition"] == sweep_label].sort_values(keys)["value"].to_numpy()
        b = forward[forward["condition"] == main_label].sort_values(keys)["value"].to_numpy()
        assert len(a) == len(b) > 0 and (a == b).all(), sweep_label
    relay_full = sweep[sweep["condition"] == "relay@layers=0-2"]["value"].to_numpy()
    single = sweep[sweep["condition"] == "relay@layers=1"]["value"].to_numpy()
    assert not (relay_full == single).all()  # the scopes do differ


def test_figure_and_report_section(sweep_run, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.reporting.figures.layer_scope import (
        layer_scope,
        layer_scope_table,
        sweep_curves,
    )
    from relaylens.reporting.report import render_report
    from relaylens.reporting.summaries import layer_table

    tables, manifest = sweep_run
    fig = layer_scope(tables)
    assert len(fig.axes) == 4  # scope deltas (accuracy, evidence) + sweep curves (log-prob, evidence)
    table = layer_scope_table(tables)
    assert {"relay@layer_type=sliding_attention", "relay@layer_type=full_attention"} <= set(table["condition"])
    curves = sweep_curves(tables)
    assert set(curves["kind"]) == {"single", "cumulative"} and set(curves["layer"]) == {0, 1, 2}
    # relay in layers 0..2 is relay everywhere: the cumulative curve ends at the relay scope's evidence delta
    last = curves[(curves["kind"] == "cumulative") & (curves["layer"] == 2) & (curves["metric"] == "evidence_share")]
    relay = table[(table["condition"] == "relay") & (table["metric"] == "evidence_share")]
    assert abs(float(last["mean"].iloc[0]) - float(relay["mean"].iloc[0])) < 1e-9
    assert SWEEP_SOURCE not in set(layer_table(tables["probes"])["source"])
    html = render_report(tables, manifest)
    assert '<section id="scopes">' in html and "Per-layer causal sweep" in html
    assert html.count('<section id="layer-') == 3  # one per layer: the sweep adds none
