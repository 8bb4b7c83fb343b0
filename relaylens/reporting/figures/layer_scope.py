"""Figure ``layer_scope`` (``relaylens/analyses/layer_scope.py``): which layers carry the RoPERelay effect.

Top row: paired differences against ``original`` per scope (relay everywhere, relay per band, relay per layer type,
key_only), with 95% cluster-bootstrap intervals, for accuracy (``contains``) and for the final question token's
forward evidence share (mean over layers and query heads, per record, in percentage points). Bottom row (only when
the run has the per-layer causal sweep, ``--sweep layers``): the per-layer effect curve (relay in layer ``l``
alone) beside the cumulative curve (relay in layers ``0..l``), for the log-probability of the first reference-answer
token and for the evidence share, each a paired mean difference against ``original`` with its interval band.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_other_conditions, register
from relaylens.reporting.summaries import REFERENCE, accuracy_scores, paired_deltas, record_evidence_share_pp
from relaylens.results.tables import FIRST_ANSWER_LOGPROB as LOGPROB_METRIC
from relaylens.results.tables import SWEEP_SOURCE, get_table

SCOPE_COLORS = {"relay": "#1f77b4", "key_only": "#2ca02c", "relay@layer_type=sliding_attention": "#ff7f0e",
                "relay@layer_type=full_attention": "#d62728"}
SWEEP_COLORS = {"single": "#1f77b4", "cumulative": "#7f7f7f"}


def sweep_kind(label: str) -> tuple[str, int] | None:
    """``("single", l)`` for ``relay@layers=l``, ``("cumulative", l)`` for ``relay@layers=0-l``, else None.

    >>> sweep_kind("relay@layers=4"), sweep_kind("relay@layers=0-4"), sweep_kind("relay@band=late")
    (('single', 4), ('cumulative', 4), None)
    """
    prefix = "relay@layers="
    if not label.startswith(prefix):
        return None
    rest = label[len(prefix):]
    if rest.isdigit():
        return "single", int(rest)
    low, _, high = rest.partition("-")
    if low == "0" and high.isdigit():
        return "cumulative", int(high)
    return None


def scope_order(conditions) -> list[str]:
    """relay, relay per band (early, middle, late), relay per layer type, other scopes, key_only, the rest."""
    def rank(c: str) -> tuple:
        for i, prefix in enumerate(("relay", "relay@band=early", "relay@band=middle", "relay@band=late",
                                    "relay@layer_type=", "relay@", "key_only")):
            if c == prefix or (prefix.endswith(("=", "@")) and c.startswith(prefix)):
                return (i, c)
        return (99, c)
    return sorted((c for c in dict.fromkeys(conditions) if c != REFERENCE and sweep_kind(c) is None), key=rank)


def scope_color(condition: str) -> str:
    band = condition.split("@band=")[-1] if "@band=" in condition else None
    return plots.BAND_SHADES.get(band) or SCOPE_COLORS.get(condition, "#8c564b")


def per_record_evidence(tables: dict, source: str = "forward") -> pd.DataFrame:
    """One ``evidence_share`` value (pp) per (record, selector, budget, condition): the mean over layers and query
    heads at the final question token, in the long score format
    (:func:`relaylens.reporting.summaries.record_evidence_share_pp` under this figure's metric name)."""
    return record_evidence_share_pp(tables, source=source).assign(metric="evidence_share")


def sweep_curves(tables: dict) -> pd.DataFrame:
    """Paired differences vs original of each sweep condition: columns ``kind, layer, metric, mean, low, high``."""
    scores = get_table(tables, "scores")
    logprob = scores[scores["metric"] == LOGPROB_METRIC]
    frames = [paired_deltas(logprob, [], metrics=(LOGPROB_METRIC,))]
    share = per_record_evidence(tables, SWEEP_SOURCE)
    if len(share):
        frames.append(paired_deltas(share, [], metrics=("evidence_share",)))
    deltas = pd.concat(frames, ignore_index=True)
    kinds = deltas["condition"].map(sweep_kind)
    deltas = deltas[kinds.notna()].assign(kind=kinds.dropna().map(lambda k: k[0]),
                                          layer=kinds.dropna().map(lambda k: k[1]))
    if len(deltas):  # relay@layers=0 is both the first single-layer and the first cumulative point
        first = deltas[(deltas["kind"] == "single") & (deltas["layer"] == 0)].assign(kind="cumulative")
        deltas = pd.concat([deltas, first], ignore_index=True)
    return deltas.sort_values(["metric", "kind", "layer"]).reset_index(drop=True)


def _scope_panel(ax, deltas: pd.DataFrame, metric: str, ylabel: str) -> None:
    sub = deltas[deltas["metric"] == metric]
    order = scope_order(sub["condition"])
    for i, cond in enumerate(order):
        r = sub[sub["condition"] == cond].iloc[0]
        ax.errorbar(i, r["mean"], yerr=[[max(r["mean"] - r["low"], 0)], [max(r["high"] - r["mean"], 0)]], fmt="o",
                    ms=5, color=scope_color(cond), ecolor="#333333", elinewidth=1, capsize=2, zorder=3)
    ax.axhline(0, color="#999999", lw=0.8, zorder=1)
    ax.set_xticks(range(len(order)), order, rotation=35, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.set_ylabel(ylabel)


def _curve_panel(ax, curves: pd.DataFrame, metric: str, ylabel: str, num_layers: int) -> None:
    sub = curves[curves["metric"] == metric]
    if sub.empty:
        plots.note_axis(ax, f"no {metric} rows in the sweep")
        return
    plots.shade_bands(ax, num_layers)
    for kind, label in (("single", "relay in layer l only"), ("cumulative", "relay in layers 0..l")):
        k = sub[sub["kind"] == kind]
        ax.plot(k["layer"], k["mean"], marker="o", ms=3, lw=1.2, color=SWEEP_COLORS[kind], label=label)
        ax.fill_between(k["layer"], k["low"], k["high"], color=SWEEP_COLORS[kind], alpha=0.18, lw=0)
    ax.axhline(0, color="#999999", lw=0.8)
    ax.set_xlabel("layer l")
    ax.set_ylabel(ylabel)
    ax.legend(loc="best", fontsize=7)


@register("layer_scope", "figure", "Which layers carry the effect: relay per band / layer type, per-layer sweep",
          needs_other_conditions)
def layer_scope(tables: dict) -> Figure:
    scores = accuracy_scores(tables)
    deltas = pd.concat([paired_deltas(scores, [], metrics=("contains",)),
                        paired_deltas(per_record_evidence(tables), [], metrics=("evidence_share",))], ignore_index=True)
    curves = sweep_curves(tables)
    rows = 1 + (not curves.empty)
    fig = Figure(figsize=(9.0, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, 2, squeeze=False)
    _scope_panel(axes[0, 0], deltas, "contains", "accuracy minus original (paired)")
    axes[0, 0].set_title("accuracy (contains)")
    if (deltas["metric"] == "evidence_share").any():
        _scope_panel(axes[0, 1], deltas, "evidence_share", "evidence share, pp vs original")
        axes[0, 1].set_title("final-token evidence share (mean over layers, heads)")
    else:
        plots.note_axis(axes[0, 1], "no forward evidence_share probes in this run")
    if rows == 2:
        probes = get_table(tables, "probes")
        num_layers = int(probes["layer"].max()) + 1 if len(probes) else int(curves["layer"].max()) + 1
        _curve_panel(axes[1, 0], curves, LOGPROB_METRIC, "log p(first answer token) vs original", num_layers)
        axes[1, 0].set_title("per-layer causal sweep: first answer token", pad=14)
        _curve_panel(axes[1, 1], curves, "evidence_share", "evidence share, pp vs original", num_layers)
        axes[1, 1].set_title("per-layer causal sweep: evidence share", pad=14)
    fig.supxlabel(f"{plots.units_note(scores)}; intervals: 95% paired cluster bootstrap", fontsize=7, color="#555555")
    return fig


def layer_scope_table(tables: dict) -> pd.DataFrame:
    """The numbers of the top row: per scope, paired mean difference vs original and its interval, per metric."""
    scores = accuracy_scores(tables)
    deltas = pd.concat([paired_deltas(scores, [], metrics=("contains",)),
                        paired_deltas(per_record_evidence(tables), [], metrics=("evidence_share",))], ignore_index=True)
    order = {c: i for i, c in enumerate(scope_order(deltas["condition"]))}
    deltas = deltas[deltas["condition"].isin(order)]
    return deltas.assign(_o=deltas["condition"].map(order)).sort_values(["metric",
                                                                         "_o"]).drop(columns="_o").reset_index(drop=True)


def _fmt(value) -> str:
    return "" if value is None or not np.isfinite(value) else f"{value:.3f}"


def report_rows(tables: dict) -> tuple[list[dict], list[dict]]:
    """Layer-scope rows (scoped conditions vs original, paired) and per-layer sweep rows, when the run has them."""
    conditions = set(get_table(tables, "scores")["condition"])
    scopes = []
    if any("@" in c for c in conditions):
        table = layer_scope_table(tables)
        for cond, g in table.groupby("condition", sort=False):
            by_metric = {r["metric"]: r for _, r in g.iterrows()}
            cells = []
            for metric in ("contains", "evidence_share"):
                r = by_metric.get(metric)
                cells.append("" if r is None else f"{r['mean']:+.3f} [{r['low']:.3f}, {r['high']:.3f}]")
            scopes.append({"condition": cond, "n": int(g["n"].max()), "cells": cells})
    curves = sweep_curves(tables)
    sweep = []
    if len(curves):
        wide = curves.set_index(["layer", "metric", "kind"])["mean"]
        for layer in sorted(curves["layer"].unique()):
            sweep.append({"layer": int(layer), "cells": [_fmt(wide.get((layer, metric, kind))) for metric in
                          ("first_answer_logprob", "evidence_share") for kind in ("single", "cumulative")]})
    return scopes, sweep
