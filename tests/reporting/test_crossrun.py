"""Several runs as one grid, the metric choice, and the paper's Table 8 against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from relaylens.errors import RelaylensError
from relaylens.reporting.crossrun import (
    FALLBACK_NOTE,
    choose_metrics,
    load_runs,
    paired_settings_table,
    settings_count,
)
from relaylens.results.store import RunStore, UnitKey, build_manifest


def _scores(metric_values: dict[str, list[tuple[float, float]]], selector="bm25", budget=0.1, **labels):
    """Long scores rows: per metric, per record ``(original, relay)`` values."""
    rows = []
    for metric, pairs in metric_values.items():
        for i, (orig, relay) in enumerate(pairs):
            for cond, value in (("original", orig), ("relay", relay)):
                rows.append(dict(record_id=f"r{i}", selector=selector, budget=budget, condition=cond,
                                 question_type="t", is_abstention=False, cluster_id=None, metric=metric, value=value,
                                 **labels))
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("metrics", "requested", "expected", "noted"), [
    (["contains", "f1"], None, ("contains", "f1"), True),
    (["contains", "f1", "judge"], None, ("judge",), False),
    (["contains", "f1", "choice_accuracy"], None, ("choice_accuracy",), False),
    (["contains", "f1", "judge_gpt_oss"], None, ("judge_gpt_oss",), False),
    (["contains", "f1", "judge"], "f1", ("f1",), False),
    (["contains", "exact_match"], "em", ("exact_match",), False),
    (["contains", "f1", "judge_small"], "contains,f1", ("contains", "f1"), False),
    (["contains", "f1", "judge_small"], " f1 , contains ,f1", ("f1", "contains"), False),
])
def test_metric_choice(metrics, requested, expected, noted):
    scores = _scores({m: [(0.0, 1.0)] for m in metrics})
    chosen, note = choose_metrics(scores, requested)
    assert chosen == expected and (note == FALLBACK_NOTE) == noted


def test_requesting_a_missing_metric_is_one_clear_error():
    scores = _scores({"contains": [(0.0, 1.0)], "judge": [(np.nan, np.nan)]})  # only failed verdicts
    with pytest.raises(RelaylensError, match="every 'judge' score of the run is NaN"):  # rows there (issue 52)
        choose_metrics(scores, "judge")
    with pytest.raises(RelaylensError, match="--metric f1: the run has no 'f1' scores"):
        choose_metrics(scores, "contains,f1")
    with pytest.raises(RelaylensError, match="names no metric"):
        choose_metrics(scores, " , ")


def test_table8_paired_differences_and_sign_counts():
    up = _scores({"judge": [(0, 1), (0, 1), (1, 1), (0, 0)]}, selector="bm25")  # +0.5
    down = _scores({"judge": [(1, 0), (1, 1), (1, 1), (1, 1)]}, selector="snapkv")  # -0.25
    flat = _scores({"judge": [(1, 1), (0, 0)]}, selector="h2o")  # 0
    table = paired_settings_table(pd.concat([up, down, flat]), "judge").set_index("selector")
    assert table.loc["bm25", "delta"] == pytest.approx(0.5) and table.loc["bm25", "sign"] == "+"
    assert table.loc["snapkv", "delta"] == pytest.approx(-0.25) and table.loc["snapkv", "sign"] == "-"
    assert table.loc["h2o", "sign"] == "0" and table.loc["bm25", "original"] == pytest.approx(0.25)
    assert (table.delta_low <= table.delta).all() and (table.delta <= table.delta_high).all()
    # bm25's resampled means take values in multiples of 1/4 within [0, 1]; 10,000 resamples reach both ends' region
    assert 0.0 <= table.loc["bm25", "delta_low"] <= 0.25 and 0.75 <= table.loc["bm25", "delta_high"] <= 1.0
    assert settings_count(table).startswith("1 of 3 settings improve (1 positive, 1 negative, 1 zero); 3 setting(s) "
                                            "with fewer than 10 clusters")


def test_relay_gain_draws_table8_sorted_by_difference():
    """The per-setting figure (e.g. one row per kvpress press): one point per setting at its paired difference,
    sorted, with Table 8's interval and both means in the label."""
    from relaylens.reporting.figures import build

    scores = pd.concat([_scores({"contains": [(0, 1), (0, 1), (1, 1), (0, 0)]}, selector="kvpress:TOVAPress"),
                        _scores({"contains": [(1, 0), (1, 1), (1, 1), (1, 1)]}, selector="kvpress:KnormPress"),
                        _scores({"contains": [(1, 1), (0, 0)]}, selector="h2o")])
    fig = build("relay_gain", {"scores": scores, "metrics": ("contains",)})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["kvpress:KnormPress @ 10%  (1.00 -> 0.75)", "h2o @ 10%  (0.50 -> 0.50)",
                      "kvpress:TOVAPress @ 10%  (0.25 -> 0.75)"]
    points = ax.lines[0].get_xdata()  # the markers of the errorbar container, bottom to top
    assert np.allclose(points, [-0.25, 0.0, 0.5])
    table = paired_settings_table(scores, "contains").set_index("selector")
    segments = ax.collections[0].get_segments()  # one horizontal interval per setting, bottom to top
    for segment, name in zip(segments, ["kvpress:KnormPress", "h2o", "kvpress:TOVAPress"]):
        assert segment[:, 0].min() == pytest.approx(table.loc[name, "delta_low"])
        assert segment[:, 0].max() == pytest.approx(table.loc[name, "delta_high"])
    assert "1 of 3 settings improve" in ax.get_title()


def _run_dir(path, model, dataset, scores):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.parent / f"{dataset}.json"
    data.write_text("[]")
    store = RunStore.create_or_open(path, build_manifest("main_table", {}, model, "hash", data))
    for rid, g in scores.groupby("record_id"):
        store.write_unit(UnitKey(rid, "bm25", 0.1), [], g.to_dict("records"), [])
    store.consolidate()
    return path


def test_load_runs_labels_models_and_datasets_and_keeps_pairs_apart(tmp_path):
    a = _run_dir(tmp_path / "a" / "run", "/models/Llama-3.1-8B-Instruct", "lme_s", _scores({"judge": [(0, 1), (0, 1)]}))
    b = _run_dir(tmp_path / "b" / "run", "/models/Qwen2-7B-Instruct", "lme_s", _scores({"judge": [(1, 0), (1, 1)]}))
    tables, labels = load_runs([a, b])
    assert [(x["model"], x["dataset"]) for x in labels] == [("Llama-3.1-8B-Instruct", "lme_s"),
                                                             ("Qwen2-7B-Instruct", "lme_s")]
    table = paired_settings_table(tables["scores"], "judge").set_index("model")
    assert table.loc["Llama-3.1-8B-Instruct", "delta"] == 1.0 and table.loc["Qwen2-7B-Instruct", "delta"] == -0.5
    assert tables["scores"].record_id.nunique() == 4, "record r0 of two runs are two records"
    with pytest.raises(RelaylensError, match="same model and dataset"):
        load_runs([a, a])


@pytest.mark.parametrize(("path", "label"), [
    ("data/lme_qwen_2048.json.gz", "lme_qwen_2048"), ("/abs/longmemeval_s.json", "longmemeval_s"),
    ("sets/persona.jsonl.zst", "persona"), ("runs/x.parquet", "x"), ("sample", "sample"), (None, "?"),
])
def test_run_labels_drop_format_and_compression_suffixes(path, label):
    from relaylens.reporting.crossrun import run_label

    manifest = {"model": {"spec": "models/qwen2.5-coder-0.5b-instruct/"}, "dataset": {"path": path}}
    assert run_label(manifest) == {"model": "qwen2.5-coder-0.5b-instruct", "dataset": label}


def _planned_run_dir(path, model, dataset, scores, planned_records):
    """A run directory whose manifest plans ``planned_records`` x bm25 @ 0.1 and holds the units of ``scores``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.parent / f"{dataset}.json"
    data.write_text("[]")
    config = {"spec": {"selectors": ["bm25"], "budgets": [0.1], "figures": []}}
    manifest = build_manifest("main_table", config, model, "hash", data, plan={"record_ids": planned_records})
    store = RunStore.create_or_open(path, manifest)
    for rid, g in scores.groupby("record_id"):
        store.write_unit(UnitKey(rid, "bm25", 0.1), [], g.to_dict("records"), [])
    store.consolidate()
    return path


def test_cross_run_figures_and_report_say_which_run_is_incomplete(tmp_path):
    """Issue 41, item 10: a run missing planned units gets, inside a grid, the "K of N planned units" warning it gets
    alone: warned when loading, in every figure footer and table note, and in the report."""
    import warnings

    from relaylens.reporting.figures import build
    from relaylens.reporting.figures.registry import footer_lines
    from relaylens.reporting.figures.writer import load_run_tables, write_figures
    from relaylens.reporting.report import write_report

    judged = _scores({"judge": [(0, 1), (0, 1), (1, 1)]})
    complete = _planned_run_dir(tmp_path / "a" / "run", "/models/Llama", "lme_s", judged, ["r0", "r1", "r2"])
    killed = _planned_run_dir(tmp_path / "b" / "run", "/models/Qwen", "lme_s", judged[judged.record_id != "r2"],
                              ["r0", "r1", "r2", "r3"])
    line = "incomplete run Qwen x lme_s: 2 of 4 planned units"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tables, _ = load_run_tables([complete, killed])
    assert any(f"{killed} holds 2 of the 4 units" in str(w.message) for w in caught)
    assert line in footer_lines(tables) and not any("Llama" in x for x in footer_lines(tables))
    figure = build("relay_gain", tables)
    assert line in figure._supxlabel.get_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = write_figures([complete, killed], out=tmp_path / "grid", formats=["png"])
        html = write_report([complete, killed], out=tmp_path / "grid" / "report.html").read_text()
    notes = [p.read_text() for p in written if p.suffix == ".md"]
    assert notes and all(line in note for note in notes)
    assert "Qwen x lme_s: 2 of 4 planned units (incomplete" in html and "Llama x lme_s: 3 of 3 planned units" in html
