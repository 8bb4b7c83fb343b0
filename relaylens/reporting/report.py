"""The per-layer HTML report of a run: one self-contained file rendered from the result tables.

``relaylens report RUN_DIR`` writes ``RUN_DIR/report.html``: run summary and manifest, the condition table with
95% paired intervals, the run's figures (base64 PNG), a layer x head heat map of the evidence-share change vs
``original``, one ``<section id="layer-{L}">`` per layer with every readout per condition and its band, and a
per-record drill-down (gold units kept by the selection, the answer under each condition, correctness). The data
behind the page is embedded as JSON in ``<script type="application/json" id="relaylens-data">``. Nothing is loaded
from the network: no CDN, no external URL (strings that contain ``://`` are written with an entity / JSON escape),
and ids are deterministic, so the same run renders to the same bytes. Several run directories (one per model x
dataset) render one cross-run report: Table 1 over models and datasets, Table 8 with its "N of M settings improve"
count, the cross-judge table, and no per-layer sections (layers differ per model).

Example:
    >>> from relaylens.results.tables import example_tables
    >>> tables = example_tables(records=2, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"),
    ...                         replay=(), layers=3, teacher=False)
    >>> html = render_report(tables, {"analysis": "demo"})
    >>> html.count('<section id="layer-'), "http://" in html, "https://" in html
    (3, False, False)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures import REGISTRY, build
from relaylens.reporting.figures.heatmap import HEATMAP_METRIC, evidence_heatmap
from relaylens.reporting.figures.layer_scope import report_rows
from relaylens.reporting.figures.paired_settings import table8_lines
from relaylens.reporting.figures.registry import (
    FigureError,
    check_not_empty,
    cross_run_entries,
    figure_plan,
    needs_probes,
)
from relaylens.reporting.figures.writer import load_run_tables, skipped_tables, status_rows, warn_not_drawn
from relaylens.reporting.htmlsafe import clean, finalize, interval, json_script, num, records
from relaylens.reporting.retention import retention_lines
from relaylens.reporting.summaries import (
    REFERENCE,
    accuracy_scores,
    accuracy_table,
    budget_label,
    condition_order,
    layer_table,
    metric_list,
    table_cells,
)
from relaylens.reporting.token_view import view_html
from relaylens.results.atomic import write_atomic
from relaylens.results.locks import output_lock
from relaylens.results.manifest import manifest_section
from relaylens.results.tables import get_table
from relaylens.results.views import load_views

__all__ = ["render_report", "write_report", "report_context", "TEMPLATE"]

TEMPLATE = "report.html.j2"
OWN_SECTIONS = ("table1", "layer_bands")
"""Registered tables the report shows in sections of its own (conditions, evidence bands); every other table a run
draws (e.g. Table 2, Table 7) gets a table of its own in the "Tables" section."""


def _png(fig: Figure, dpi: int = 100) -> str:
    with plots.style():
        return plots.figure_png_base64(fig, dpi=dpi)


# ---------------------------------------------------------------------------------------------------- context

def _summary(tables: dict, manifest: dict) -> list[tuple[str, str]]:
    answers, probes = tables["answers"], tables["probes"]
    scores = accuracy_scores(tables)
    keyed = answers if len(answers) else scores
    model, dataset = manifest_section(manifest, "model"), manifest_section(manifest, "dataset")
    rows = [
        ("analysis", manifest.get("analysis") or "?"),
        ("model", f"{model.get('spec') or '?'}" + (f" (weights {str(model['weights_hash'])[:12]})"
                                                  if model.get("weights_hash") else "")),
        ("dataset", f"{dataset.get('path', '?')}" + (f" (sha256 {str(dataset['sha256'])[:12]})"
                                                     if dataset.get("sha256") else "") if dataset else "?"),
        ("git commit", str(manifest.get("git_commit") or "?")),
        ("created", str(manifest.get("created_at") or "?")),
        ("records", str(keyed["record_id"].nunique())),
        ("selectors", ", ".join(sorted(keyed["selector"].unique()))),
        ("budgets", ", ".join(budget_label(b) for b in sorted(keyed["budget"].unique()))),
        ("conditions", ", ".join(condition_order(keyed["condition"].unique()))),
    ]
    if manifest.get("runs"):  # a cross-run report: one run directory per model x dataset
        rows[1:5] = [("runs", "; ".join(f"{r['model']} x {r['dataset']} ({r['run_dir']})" for r in manifest["runs"]))]
    if "question_type" in keyed and len(keyed):
        rows.append(("question types", ", ".join(sorted(keyed["question_type"].unique()))))
    if len(probes):
        rows.append(("probes", f"{int(probes['layer'].max()) + 1} layers x {int(probes['head'].max()) + 1} heads; "
                     + ", ".join(sorted(probes["probe_point"].unique()))))
    rows += _paper_rows(tables)
    return rows + status_rows(tables)


def _paper_rows(tables: dict) -> list[tuple[str, str]]:
    """The metric (and its note), evidence retention and Table 8's settings count."""
    scores = accuracy_scores(tables)
    metrics = metric_list(scores)
    rows = [("metric", ", ".join(metrics) + (f" ({tables['metric_note']})" if tables.get("metric_note") else ""))]
    if len(tables["answers"]):
        rows += [("evidence retention", line) for line in retention_lines(tables["answers"])]
    return rows + table8_lines(scores, metrics)


def _condition_table(tables: dict) -> tuple[list[dict], pd.DataFrame | None]:
    """Table 1's rows (per model x dataset too, in a cross-run grid) and the table itself."""
    scores = accuracy_scores(tables)
    if not len(scores):
        return [], None
    labels = [c for c in ("model", "dataset") if c in scores.columns]
    table = accuracy_table(tables, by=(*labels, "selector", "budget"))
    rows = []
    for _, r in table.iterrows():
        rows.append({**{c: r[c] for c in labels}, "selector": r["selector"], "budget": budget_label(float(r["budget"])),
                     "condition": r["condition"], "n": int(r["n"]),
                     "cells": [interval(r, m) for m in metric_list(accuracy_scores(tables)) if m in table]
                     + [interval(r, f"{m}_delta", signed=True) for m in metric_list(accuracy_scores(tables))
                        if m in table]})
    return rows, table


def _point_label(point: str) -> str:
    return {"question_final": "final question token", "first_answer_token": "first answer token (teacher-forced)"}.get(
        point, point)


def _readout_name(point: str, source: str, metric: str) -> str:
    return f"{metric} ({source}), {_point_label(point)}"


def _with_delta(value: float, delta: float, delta_pp: float, reference: bool) -> str:
    text = num(value)
    if not reference and np.isfinite(delta):
        text += f" ({delta_pp:+.1f}pp)" if np.isfinite(delta_pp) else f" ({delta:+.3f})"
    return text


def _layers(layer_table: pd.DataFrame) -> list[dict]:
    """One entry per layer: its band and a readout x condition grid of ``value (delta)`` strings."""
    conditions = condition_order(layer_table["condition"].unique())
    point_rank = {"question_final": 0, "first_answer_token": 1}
    readouts = sorted(set(layer_table[["probe_point", "source", "metric"]].itertuples(index=False, name=None)),
                      key=lambda t: (point_rank.get(t[0], 2), t[0], t[1], t[2]))
    index = {(r.probe_point, r.source, r.metric, r.condition, r.layer): r
             for r in layer_table.itertuples(index=False)}
    out = []
    for layer in sorted(layer_table["layer"].unique()):
        band = layer_table.loc[layer_table["layer"] == layer, "band"].iloc[0]
        grid = []
        for point, source, metric in readouts:
            cells = []
            for cond in conditions:
                r = index.get((point, source, metric, cond, layer))
                if r is None:
                    cells.append("")
                    continue
                cells.append(_with_delta(r.value, r.delta, r.delta_pp, cond == REFERENCE))
            grid.append({"group": _point_label(point), "readout": f"{metric} ({source})", "cells": cells})
        out.append({"layer": int(layer), "band": band, "conditions": conditions, "grid": grid})
    return out


def _band_rows(tables: dict) -> list[dict]:
    t8 = build("layer_bands", tables)
    t8 = t8[t8["selector"] == "all"]
    rows = []
    for (point, source, metric, cond), g in t8.groupby(["probe_point", "source", "metric", "condition"], sort=False):
        by_band = {r["band"]: r for _, r in g.iterrows()}
        cells = []
        for band in ("early", "middle", "late"):
            r = by_band.get(band)
            if r is None:
                cells.append("")
                continue
            cells.append(_with_delta(r["value"], r["delta"], r["delta_pp"], cond == REFERENCE))
        rows.append({"readout": _readout_name(point, source, metric), "condition": cond, "cells": cells})
    return rows


def _heatmap(probes: pd.DataFrame) -> str | None:
    """Layer x head heat maps of the evidence-share change vs original (pp), one panel per condition."""
    with plots.style():
        fig = evidence_heatmap(probes, HEATMAP_METRIC)
        return None if fig is None else plots.figure_png_base64(fig, dpi=100)


def _drilldown(tables: dict) -> list[dict]:
    answers, scores = tables["answers"], tables["scores"]
    metrics = metric_list(accuracy_scores(tables))
    wide = (scores[scores["metric"].isin(set(metrics) | {"contains", "f1"})]
            .pivot_table(index=["record_id", "selector", "budget", "condition"], columns="metric", values="value",
                         aggfunc="first"))
    units = []
    for (rid, sel, budget), g in answers.groupby(["record_id", "selector", "budget"], sort=True):
        first = g.iloc[0]
        try:
            refs = json.loads(first["references"])
            refs = refs if isinstance(refs, list) else [refs]
        except (TypeError, ValueError):
            refs = [str(first["references"])]
        rows = []
        order = {c: i for i, c in enumerate(condition_order(g["condition"]))}
        for _, r in g.assign(_o=g["condition"].map(order)).sort_values("_o").iterrows():
            key = (rid, sel, budget, r["condition"])
            values = wide.loc[key].to_dict() if key in wide.index else {}
            contains = values.get("contains")
            main = values.get(metrics[0]) if metrics else None  # correctness under the reported metric
            correct = None if main is None or not np.isfinite(main) else bool(main >= 0.5)
            rows.append({"condition": r["condition"], "answer": r["answer"], "stop": r["stop_reason"],
                         "tokens": int(r["new_tokens"]), "contains": num(contains), "f1": num(values.get("f1")),
                         "correct": correct})
        n_correct = sum(1 for r in rows if r["correct"])
        units.append({"id": f"rec-{len(units)}", "record_id": rid, "selector": sel,
                      "budget": budget_label(float(budget)), "question_type": first["question_type"],
                      "kept": int(first["gold_units_kept"]), "total": int(first["gold_units_total"]),
                      "references": ", ".join(map(str, refs)), "rows": rows, "n_correct": n_correct})
    return units


def report_context(tables: dict, manifest: dict, figure_names: list[str] | None = None,
                   views: list[dict] | None = None) -> dict:
    """Everything the template needs (plain strings, numbers and base64 PNGs); each entry of ``SPEC.figures`` the
    tables cannot support is warned about and listed as not drawn.

    ``views``: stored token views (:func:`relaylens.results.views.load_views`) shown in the token-view section.
    """
    check_not_empty(tables)
    everything = tables  # paper tables may read more than the three main tables (Table 2: the skipped records)
    tables = {**{k: tables[k] for k in ("metrics", "metric_note", "run_status") if k in tables},
              **{name: get_table(tables, name) for name in ("answers", "scores", "probes", "skipped", "geometry")}}
    probes = tables["probes"]
    condition_rows, condition_table = _condition_table(tables)
    names, not_drawn = (figure_names, {}) if figure_names is not None else figure_plan(tables, manifest)
    warn_not_drawn(not_drawn)
    rendered, paper_tables = [], []
    for name in names:
        entry = REGISTRY[name]
        if entry.kind == "figure":
            rendered.append({"name": name, "title": entry.title, "png": _png(build(name, tables))})
        elif name not in OWN_SECTIONS:
            head, rows = table_cells(build(name, everything))
            paper_tables.append({"name": name, "title": entry.title, "head": head, "rows": rows})
    paper_tables += skipped_tables(tables)  # the units that were not run, and why
    grid = bool(manifest.get("runs"))
    has_probes = not grid and needs_probes(tables) is None
    scope_rows, sweep_rows = report_rows(tables)
    per_layer = layer_table(probes) if has_probes else None
    data = {
        "analysis": manifest.get("analysis"),
        "conditions": records(condition_table) if condition_table is not None else [],
        "layers": records(per_layer) if per_layer is not None else [],
    }
    return {
        "title": f"relaylens report: {manifest.get('analysis') or 'run'}",
        "summary": _summary(tables, manifest) + [("not drawn", f"{n}: {why}") for n, why in not_drawn.items()],
        "manifest_json": json.dumps(manifest, indent=2, sort_keys=True, default=str),
        "metrics": [m for m in metric_list(accuracy_scores(tables))
                    if condition_table is not None and m in condition_table],
        "condition_rows": condition_rows,
        "grid": grid,
        "figures": rendered,
        "paper_tables": paper_tables,
        "has_probes": has_probes,
        "no_probes_reason": needs_probes(tables),
        "heatmap": _heatmap(probes) if has_probes else None,
        "heatmap_readout": " / ".join(HEATMAP_METRIC),
        "band_rows": _band_rows(tables) if has_probes else [],
        "layers": _layers(per_layer) if has_probes else [],
        "records": _drilldown(tables) if len(tables["answers"]) else [],
        "scope_rows": scope_rows,
        "sweep_rows": sweep_rows,
        "data_json": json_script(clean(data)),
        "token_view": Markup(view_html(views)) if views else None,
        "token_view_records": len({v["record_id"] for v in views or []}),
    }


def _environment():
    import jinja2  # noqa: PLC0415 - import cost: jinja2 loads on first use

    return jinja2.Environment(loader=jinja2.PackageLoader("relaylens.reporting", "templates"), autoescape=True,
                              finalize=finalize, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render_report(tables: dict, manifest: dict, figure_names: list[str] | None = None,
                  views: list[dict] | None = None) -> str:
    """The report as one HTML string (self-contained, deterministic)."""
    return _environment().get_template(TEMPLATE).render(**report_context(tables, manifest, figure_names, views))


def write_report(run_dir: str | Path | list, out: str | Path | None = None, view_records: int = 3,
                 metric: str | None = None, retained_only: bool = False) -> Path:
    """Render ``RUN_DIR/report.html`` (or ``out``) from the run's tables and manifest; returns the path.

    The token view shows the stored views (``RUN_DIR/views``) of the first ``view_records`` records (0: none).
    ``metric``: a ``--metric`` name (default: the paper's metric when the run has it); ``retained_only``: probe
    sections over records whose gold evidence survived (:func:`relaylens.reporting.figures.registry.prepare_tables`).
    Several run directories (one per model x dataset) render one cross-run report into ``out`` (required)."""
    run_dirs = [Path(run_dir)] if isinstance(run_dir, (str, Path)) else [Path(d) for d in run_dir]
    if len(run_dirs) > 1 and out is None:
        raise FigureError("several run directories make one cross-run report; pass --out FILE for it")
    path = Path(out) if out else run_dirs[0] / "report.html"
    with output_lock(path.parent, run_dirs, "report"):  # one writer per written directory; a read-only run is fine
        tables, manifest = load_run_tables(run_dirs, metric, retained_only)
        if len(run_dirs) > 1:
            return write_atomic(path, render_report(tables, manifest, cross_run_entries(tables)))
        views = load_views(run_dirs[0], view_records) if view_records > 0 else []
        return write_atomic(path, render_report(tables, manifest, views=views))  # a full disk keeps the old one
