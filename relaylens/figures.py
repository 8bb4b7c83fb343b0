"""Every paper figure and table as a function of the result tables only: ``(tables) -> Figure`` or ``DataFrame``.

``tables`` is the dict of :func:`relaylens.results.load_tables` (``answers``, ``scores``, ``probes``; columns of
:mod:`relaylens.tables`). Nothing here imports torch, transformers or a model: figures are regenerated from a run
directory on any machine (``relaylens figures RUN_DIR``). Accuracy is ``contains`` with ``f1`` alongside; intervals
are 95% paired cluster-bootstrap intervals (:mod:`relaylens.bootstrap`).

Registry (:data:`REGISTRY`, by name; ``SPEC.figures`` of each analysis names its entries):

========== ======= =================================================================================================
name       kind    what
========== ======= =================================================================================================
table1     table   accuracy per selector x budget x condition, with the paired difference vs ``original``
table6     table   the same per question type
table8     table   evidence-reading band table (early / middle / late means, deltas vs original in pp)
table3     table   complete-request time and overhead over original (``relaylens.overhead``)
figure3    figure  budget curves: accuracy vs budget, one panel per selector, original vs relay
figure4    figure  coordinate ablation: per-condition means and paired differences vs original, band deltas
figure5    figure  ordering: source / score / reverse / RandomMean (mean over ``random_order(seed)``) and seed spread
figure6    figure  evidence reading per layer (replay gold share, evidence share, value norm) + compaction(alpha)
alignment  figure  relay (right-aligned) vs rank_sync (left-aligned) accuracy and per-layer evidence share
========== ======= =================================================================================================

Example:
    >>> sorted(REGISTRY)
    ['alignment', 'figure3', 'figure4', 'figure5', 'figure6', 'table1', 'table3', 'table6', 'table8']
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens import plots
from relaylens.errors import RelaylensError
from relaylens.summaries import (  # noqa: F401 - re-exported for figure users
    METRICS, REFERENCE, _budget_label, accuracy_means, alpha_of, layer_table, paired_deltas, table_markdown,
    with_random_mean)
from relaylens.tables import TABLES

__all__ = ["REGISTRY", "FigureEntry", "FigureError", "METRICS", "build", "select_figures", "write_figures",
           "supported", "table_markdown", "accuracy_table", "layer_table", "with_random_mean", "alpha_of",
           "COMPANIONS"]

COMPANIONS = {"figure6": ("table8",)}
"""Entries drawn together with a figure named in ``SPEC.figures`` (Figure 6's numbers are Table 8)."""
EVIDENCE_PANELS = (("replay", "replay_gold_share", "phase-replay gold share"),
                   ("forward", "evidence_share", "evidence attention share"),
                   ("forward", "evidence_value_norm", "evidence value norm"))
FIGURE6_CONDITIONS = ("original", "half_gap", "relay")
PROBE_POINTS = (("question_final", "final question token"), ("first_answer_token", "first answer token (teacher-forced)"))


class FigureError(RelaylensError):
    """A figure that the run's tables cannot support, or tables that are empty."""


@dataclass(frozen=True)
class FigureEntry:
    """One registered figure or table: ``build(tables)`` and ``needs(tables)`` (why it cannot be built, or None)."""

    name: str
    kind: str  # "figure" | "table"
    title: str
    build: Callable[[dict], Figure | pd.DataFrame]
    needs: Callable[[dict], str | None]


REGISTRY: dict[str, FigureEntry] = {}


def _register(name: str, kind: str, title: str, needs: Callable[[dict], str | None]):
    def wrap(fn):
        REGISTRY[name] = FigureEntry(name, kind, title, fn, needs)
        return fn
    return wrap


# ------------------------------------------------------------------------------------------------ requirements

def _table(tables: dict, name: str) -> pd.DataFrame:
    df = tables.get(name)
    if df is None:
        return pd.DataFrame({c: [] for c in TABLES[name]})
    return df


def _accuracy_scores(tables: dict) -> pd.DataFrame:
    scores = _table(tables, "scores")
    return scores[scores["metric"].isin(METRICS)]


def _needs_scores(tables: dict) -> str | None:
    return None if len(_accuracy_scores(tables)) else "no contains/f1 rows in the scores table"


def _needs_answers(tables: dict) -> str | None:
    return None if len(_table(tables, "answers")) else "the answers table is empty"


def _needs_other_conditions(tables: dict) -> str | None:
    reason = _needs_scores(tables)
    if reason:
        return reason
    conds = set(_accuracy_scores(tables)["condition"])
    return None if len(conds - {REFERENCE}) else "only one condition in the scores table"


def _needs_budgets(tables: dict) -> str | None:
    reason = _needs_scores(tables)
    return reason or (None if _accuracy_scores(tables)["budget"].nunique() > 1 else "a single budget (no curve to draw)")


def _needs_ordering(tables: dict) -> str | None:
    reason = _needs_scores(tables)
    conds = set(_accuracy_scores(tables)["condition"])
    if reason:
        return reason
    ordered = {c for c in conds if re.match(r"(score_order|reverse_order|random_order\(.*\))$", c)}
    return None if ordered else "no score_order / reverse_order / random_order(seed) conditions"


def _needs_rank_sync(tables: dict) -> str | None:
    reason = _needs_scores(tables)
    return reason or (None if "rank_sync" in set(_accuracy_scores(tables)["condition"]) else "no rank_sync condition")


def _needs_probes(tables: dict) -> str | None:
    probes = _table(tables, "probes")
    if not len(probes):
        return "the run has no probes (analysis without probes=True)"
    have = set(probes["metric"])
    return None if have & {"evidence_share", "replay_gold_share"} else "no evidence readouts in the probes table"


def supported(tables: dict, name: str) -> str | None:
    """Why ``name`` cannot be built from ``tables`` (None: it can)."""
    if name not in REGISTRY:
        raise FigureError(f"unknown figure {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name].needs(tables)


def _check_not_empty(tables: dict) -> None:
    if not any(len(_table(tables, n)) for n in ("answers", "scores", "probes")):
        raise FigureError("the run's result tables are empty (no committed units). Fix: run or resume the analysis "
                          "(`relaylens run ANALYSIS --out RUN_DIR`) before drawing figures")


def build(name: str, tables: dict) -> Figure | pd.DataFrame:
    """Build the registered figure/table ``name`` from ``tables``; raises :class:`FigureError` if unsupported."""
    _check_not_empty(tables)
    reason = supported(tables, name)
    if reason:
        raise FigureError(f"cannot build {name}: {reason}")
    with plots.style():
        return REGISTRY[name].build(tables)


def accuracy_table(tables: dict, by: Sequence[str] = ("selector", "budget")) -> pd.DataFrame:
    """Wide accuracy table: one row per ``by + condition``; per metric ``m, m_low, m_high`` and the paired
    difference vs original ``m_delta, m_delta_low, m_delta_high`` (NaN for original); ``n`` = scored records."""
    scores = _accuracy_scores(tables)
    by = list(by)
    means = accuracy_means(scores, by + ["condition"])
    deltas = paired_deltas(scores, by)
    keys = by + ["condition"]
    out = None
    for metric in METRICS:
        m = means[means["metric"] == metric]
        if m.empty:
            continue
        part = m[keys + ["mean", "low", "high", "n"]].rename(
            columns={"mean": metric, "low": f"{metric}_low", "high": f"{metric}_high", "n": f"n_{metric}"})
        d = deltas[deltas["metric"] == metric][keys + ["mean", "low", "high"]].rename(
            columns={"mean": f"{metric}_delta", "low": f"{metric}_delta_low", "high": f"{metric}_delta_high"})
        part = part.merge(d, on=keys, how="left")
        out = part if out is None else out.merge(part, on=keys, how="outer")
    n_cols = [c for c in out.columns if c.startswith("n_")]
    out.insert(len(keys), "n", out[n_cols].max(axis=1).astype("int64"))
    out = out.drop(columns=n_cols)
    order = {c: i for i, c in enumerate(plots.condition_order(out["condition"]))}
    out = out.assign(_o=out["condition"].map(order)).sort_values(by + ["_o"], kind="mergesort").drop(columns="_o")
    return out.reset_index(drop=True)



# ------------------------------------------------------------------------------------------------------ tables

@_register("table1", "table", "Table 1: accuracy per selector and condition (contains, f1; 95% paired intervals)",
           _needs_scores)
def table1(tables: dict) -> pd.DataFrame:
    return accuracy_table(tables)


@_register("table6", "table", "Table 6: accuracy per question type", _needs_scores)
def table6(tables: dict) -> pd.DataFrame:
    return accuracy_table(tables, by=("selector", "budget", "question_type"))


@_register("table8", "table", "Table 8: evidence reading by layer band (deltas vs original; pp for shares)",
           _needs_probes)
def table8(tables: dict) -> pd.DataFrame:
    probes = _table(tables, "probes")
    num_layers = int(probes["layer"].max()) + 1
    keys = ["selector", "probe_point", "source"]
    pooled = plots.band_table(probes.assign(selector="all"), num_layers, keys)
    per_selector = plots.band_table(probes, num_layers, keys) if probes["selector"].nunique() > 1 else pooled.iloc[:0]
    out = pd.concat([pooled, per_selector], ignore_index=True)
    band_rank = {"early": 0, "middle": 1, "late": 2}
    cond_rank = {c: i for i, c in enumerate(plots.condition_order(out["condition"]))}
    point_rank = {p: i for i, (p, _) in enumerate(PROBE_POINTS)}
    out = out.assign(_b=out["band"].map(band_rank), _c=out["condition"].map(cond_rank), _s=out["selector"] != "all",
                     _p=out["probe_point"].map(point_rank).fillna(len(point_rank)))
    out = out.sort_values(["_s", "selector", "_p", "probe_point", "source", "metric", "_c", "_b"], kind="mergesort")
    return out.drop(columns=["_b", "_c", "_s", "_p"]).reset_index(drop=True)


@_register("table3", "table", "Table 3: complete-request time per condition and overhead over original", _needs_answers)
def table3(tables: dict) -> pd.DataFrame:
    """Request time (prefill + selection + question + decoding) and the paired geometric-mean overhead; see
    :mod:`relaylens.overhead` (NaN overhead for rows decoded in batches of several rows)."""
    from relaylens.overhead import overhead_table

    out = overhead_table(_table(tables, "answers"))
    cond_rank = {c: i for i, c in enumerate(plots.condition_order(out["condition"]))}
    out = out.assign(_c=out["condition"].map(cond_rank)).sort_values(["selector", "budget", "_c"], kind="mergesort")
    return out.drop(columns=["_c"]).reset_index(drop=True)


# ----------------------------------------------------------------------------------------------------- figures

def _metric_label(metric: str) -> str:
    return {"contains": "accuracy (contains)", "f1": "F1"}.get(metric, metric)


def _units_note(scores: pd.DataFrame) -> str:
    n = scores[["record_id"]].drop_duplicates().shape[0]
    sel = ", ".join(sorted(scores["selector"].unique()))
    bud = ", ".join(_budget_label(b) for b in sorted(scores["budget"].unique()))
    return f"{n} record{'s' if n != 1 else ''}; {sel} @ {bud}"


@_register("figure3", "figure", "Figure 3: accuracy vs retention budget, one panel per selector", _needs_budgets)
def figure3(tables: dict) -> Figure:
    scores = _accuracy_scores(tables)
    means = accuracy_means(scores, ["selector", "budget", "condition"])
    selectors = sorted(means["selector"].unique())
    present = set(means["condition"])
    conditions = [c for c in ("original", "relay") if c in present]
    conditions = conditions if len(conditions) == 2 else plots.condition_order(present)
    metrics = [m for m in METRICS if (means["metric"] == m).any()]
    fig = Figure(figsize=(3.0 * len(selectors) + 0.4, 2.5 * len(metrics) + 0.5), layout="constrained")
    axes = fig.subplots(len(metrics), len(selectors), squeeze=False, sharey="row")
    for i, metric in enumerate(metrics):
        for j, sel in enumerate(selectors):
            ax = axes[i, j]
            sub = means[(means["metric"] == metric) & (means["selector"] == sel)]
            for cond in conditions:
                c = sub[sub["condition"] == cond].sort_values("budget")
                if c.empty:
                    continue
                color = plots.condition_color(cond)
                ax.plot(c["budget"], c["mean"], marker="o", ms=3, lw=1.5, color=color, label=cond, zorder=3)
                ax.fill_between(c["budget"], c["low"], c["high"], color=color, alpha=0.15, lw=0, zorder=2)
            budgets = sorted(sub["budget"].unique())
            if len(budgets) > 1 and min(budgets) > 0:
                ax.set_xscale("log")
            ax.set_xticks(budgets, [_budget_label(b) for b in budgets])
            ax.minorticks_off()
            if i == 0:
                ax.set_title(sel)
            if i == len(metrics) - 1:
                ax.set_xlabel("retention budget")
            if j == 0:
                ax.set_ylabel(_metric_label(metric))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=max(1, min(len(labels), 5)))
    fig.supxlabel(f"{_units_note(scores)}; shaded: 95% cluster-bootstrap interval", fontsize=7, color="#555555")
    return fig


def _condition_bars(ax, means: pd.DataFrame, metric: str, conditions: list[str]) -> dict:
    sub = means[means["metric"] == metric]
    centres = plots.interval_bars(ax, sub, "condition", order=[c for c in conditions if c in set(sub["condition"])])
    ax.set_ylabel(_metric_label(metric))
    ax.set_ylim(bottom=0)
    return centres


def _delta_points(ax, deltas: pd.DataFrame, conditions: list[str], reference: str) -> None:
    from matplotlib.lines import Line2D

    markers = {"contains": "o", "f1": "s"}
    order = [c for c in conditions if c in set(deltas["condition"])]
    present = [m for m in METRICS if (deltas["metric"] == m).any()]
    for k, metric in enumerate(present):
        sub = deltas[deltas["metric"] == metric]
        for i, cond in enumerate(order):
            r = sub[sub["condition"] == cond]
            if r.empty:
                continue
            mean, low, high = (float(r[c].iloc[0]) for c in ("mean", "low", "high"))
            x = i + (k - 0.5) * 0.25
            ax.errorbar(x, mean, yerr=[[max(mean - low, 0)], [max(high - mean, 0)]], fmt=markers[metric], ms=4,
                        color=plots.condition_color(cond), ecolor="#333333", elinewidth=1, capsize=2, zorder=3)
    ax.axhline(0, color="#999999", lw=0.8, zorder=1)
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.set_ylabel(f"minus {reference} (paired)")
    ax.legend([Line2D([], [], marker=markers[m], color="#555555", ls="none") for m in present], present, loc="best")


def _evidence_share(probes: pd.DataFrame) -> pd.DataFrame:
    return probes[(probes["metric"] == "evidence_share") & (probes["source"] == "forward")
                  & (probes["probe_point"] == "question_final")]


def _band_delta_panel(ax, share: pd.DataFrame, conditions: list[str], reference: str) -> None:
    """Bars of each condition's evidence-share band mean minus ``reference`` (pp), early / middle / late."""
    num_layers = int(share["layer"].max()) + 1
    bt = plots.band_table(share, num_layers, [], reference=reference)
    bt = bt[bt["condition"] != reference]
    order = [c for c in conditions if c in set(bt["condition"])]
    band_colors = {"early": "#9ecae1", "middle": "#4292c6", "late": "#08519c"}
    plots.interval_bars(ax, bt.assign(mean=bt["delta_pp"], low=np.nan, high=np.nan), "condition", hue="band",
                        order=order, hue_order=["early", "middle", "late"], colors=band_colors)
    ax.axhline(0, color="#999999", lw=0.8)
    ax.set_ylabel(f"evidence share, pp vs {reference}")
    ax.set_title("evidence attention share by band")
    ax.legend(loc="best")


@_register("figure4", "figure", "Figure 4: coordinate ablation (means and paired differences vs original)",
           _needs_other_conditions)
def figure4(tables: dict) -> Figure:
    scores = _accuracy_scores(tables)
    means = accuracy_means(scores, ["condition"])
    deltas = paired_deltas(scores, [])
    conditions = plots.condition_order(scores["condition"].unique())
    share = _evidence_share(_table(tables, "probes"))
    panels = 3 + (not share.empty)
    fig = Figure(figsize=(3.3 * panels, 3.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, metric in zip(axes[:2], METRICS):
        _condition_bars(ax, means, metric, conditions)
        ax.set_title(_metric_label(metric))
    _delta_points(axes[2], deltas, [c for c in conditions if c != REFERENCE], REFERENCE)
    axes[2].set_title(f"paired difference vs {REFERENCE}")
    if not share.empty:
        _band_delta_panel(axes[3], share, conditions, REFERENCE)
    fig.supxlabel(f"{_units_note(scores)}; error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig


@_register("figure5", "figure", "Figure 5: slot ordering (RandomMean = mean over random_order seeds)", _needs_ordering)
def figure5(tables: dict) -> Figure:
    scores = with_random_mean(_accuracy_scores(tables))
    main = scores[~scores["condition"].str.match(r"random_order\(.*\)$")]
    means = accuracy_means(main, ["condition"])
    seeds = scores[scores["condition"].str.match(r"random_order\(.*\)$")]
    seed_means = seeds.groupby(["metric", "condition"])["value"].mean().reset_index()
    conditions = plots.condition_order(main["condition"].unique())
    reference = "relay" if "relay" in conditions else REFERENCE
    deltas = paired_deltas(main, [], reference=reference)
    share = _evidence_share(_table(tables, "probes"))
    if not share.empty:  # RandomMean of the readouts too: mean over seeds per (unit, layer, head)
        rnd = share[share["condition"].str.match(r"random_order\(.*\)$")]
        keys = ["record_id", "selector", "budget", "probe_point", "source", "layer", "head", "metric"]
        mean = rnd.groupby(keys, sort=True)["value"].mean().reset_index().assign(condition="RandomMean")
        share = pd.concat([share.drop(rnd.index), mean[share.columns]], ignore_index=True)
    fig = Figure(figsize=(3.5 * (3 + (not share.empty)), 3.3), layout="constrained")
    axes = fig.subplots(1, 3 + (not share.empty))
    for ax, metric in zip(axes[:2], METRICS):
        centres = _condition_bars(ax, means, metric, conditions)
        sm = seed_means[seed_means["metric"] == metric]
        if ("RandomMean", None) in centres and not sm.empty:
            x = centres[("RandomMean", None)]
            offsets = np.linspace(-0.22, 0.22, len(sm)) if len(sm) > 1 else np.zeros(1)
            ax.scatter(x + offsets, sm["value"], s=10, color="#222222", zorder=4, label="per seed")
            spread = f"seeds: {sm['value'].min():.2f}-{sm['value'].max():.2f} (sd {sm['value'].std(ddof=0):.3f})"
            ax.text(0.98, 0.98, spread, transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#333333")
            ax.legend(loc="upper left")
        ax.set_title(_metric_label(metric))
        ax.set_ylim(0, max(1.05, ax.get_ylim()[1] * 1.15))
    _delta_points(axes[2], deltas, [c for c in conditions if c != reference], reference)
    axes[2].set_title(f"paired difference vs {reference} (source order)" if reference == "relay"
                      else f"paired difference vs {reference}")
    if not share.empty:
        _band_delta_panel(axes[3], share, conditions, reference)
    n_seeds = seeds["condition"].nunique()
    fig.supxlabel(f"{_units_note(scores)}; RandomMean over {n_seeds} seed{'s' if n_seeds != 1 else ''}; "
                  "error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig


def _annotate_band_deltas(ax, data: pd.DataFrame, num_layers: int, conditions: list[str], share: bool) -> None:
    """Write each condition's band delta vs original (pp for shares) inside the band, in the condition's colour."""
    bt = plots.band_table(data, num_layers, [])
    others = [c for c in conditions if c != REFERENCE and c in set(bt["condition"])]
    for name, layers in plots.bands(num_layers).items():
        if not layers:
            continue
        x = (layers[0] + layers[-1]) / 2
        for k, cond in enumerate(others):
            row = bt[(bt["condition"] == cond) & (bt["band"] == name)]
            if row.empty:
                continue
            v = float(row["delta_pp"].iloc[0] if share else row["delta"].iloc[0])
            text = f"{v:+.1f}pp" if share else f"{v:+.3f}"
            ax.text(x, 0.93 - 0.08 * k, text, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=6.5, color=plots.condition_color(cond), zorder=5)


@_register("figure6", "figure", "Figure 6: evidence reading per layer, with the compaction(alpha) curve", _needs_probes)
def figure6(tables: dict) -> Figure:
    probes = _table(tables, "probes")
    num_layers = int(probes["layer"].max()) + 1
    points = [(p, label) for p, label in PROBE_POINTS if (probes["probe_point"] == p).any()]
    fig = Figure(figsize=(13.0, 2.9 * len(points) + 0.4), layout="constrained")
    axes = fig.subplots(len(points), 4, squeeze=False)
    present = set(probes["condition"])
    main_conditions = [c for c in FIGURE6_CONDITIONS if c in present] or [
        c for c in plots.condition_order(present) if not c.startswith("compaction(")]
    for i, (point, point_label) in enumerate(points):
        for j, (source, metric, label) in enumerate(EVIDENCE_PANELS):
            ax = axes[i, j]
            data = probes[(probes["probe_point"] == point) & (probes["source"] == source) & (probes["metric"] == metric)
                          & probes["condition"].isin(main_conditions)]
            if data.empty:
                plots.note_axis(ax, f"no {label}\nat the {point_label}" + ("\n(phase replay is computed at the final\n"
                                "question token only)" if source == "replay" else ""))
                continue
            per_layer = data.groupby(["condition", "layer"])["value"].mean().reset_index()
            plots.layer_lines(ax, per_layer, main_conditions, num_layers)
            share = metric in plots.SHARE_METRICS
            top = float(per_layer["value"].max())
            ax.set_ylim(bottom=0 if per_layer["value"].min() >= 0 else None, top=top * 1.45 if top > 0 else 1)
            _annotate_band_deltas(ax, data, num_layers, main_conditions, share)
            ax.set_title(f"{label}\n{point_label}", fontsize=8.5, pad=12)
            ax.set_ylabel(metric)
        _alpha_panel(axes[i, 3], probes, point, point_label, num_layers)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    ordered = [c for c in main_conditions if c in handles]
    fig.legend([handles[c] for c in ordered], ordered, loc="outside upper center", ncols=max(1, min(len(ordered), 6)))
    n = probes["record_id"].nunique()
    fig.supxlabel(f"{n} record{'s' if n != 1 else ''}; mean over records and heads; shaded: early / middle / late "
                  "layer bands; numbers: band mean minus original (pp for shares)", fontsize=7, color="#555555")
    return fig


def _alpha_panel(ax, probes: pd.DataFrame, point: str, point_label: str, num_layers: int) -> None:
    """Gold share vs compaction alpha per band: phase replay if present (the full curve), else the forward pass."""
    for source, metric in (("replay", "replay_gold_share"), ("forward", "evidence_share")):
        data = probes[(probes["probe_point"] == point) & (probes["source"] == source) & (probes["metric"] == metric)]
        data = data.assign(alpha=data["condition"].map(alpha_of)).dropna(subset=["alpha"])
        if data["alpha"].nunique() >= 2:
            break
    else:
        plots.note_axis(ax, f"no compaction(alpha) conditions\nat the {point_label}")
        return
    data = data.assign(band=data["layer"].map(plots.band_of(num_layers)))
    per_layer = data.groupby(["alpha", "band", "layer"])["value"].mean().reset_index()
    colors = {"early": "#9ecae1", "middle": "#4292c6", "late": "#08519c"}
    for band in ("early", "middle", "late"):
        b = per_layer[per_layer["band"] == band].groupby("alpha")["value"].mean()
        if len(b):
            ax.plot(b.index, b.values, marker="o", ms=3, lw=1.3, color=colors[band], label=band)
    allb = per_layer.groupby("alpha")["value"].mean()
    ax.plot(allb.index, allb.values, marker="s", ms=3, lw=2, color="#222222", label="all layers")
    ax.set_xlabel("compaction alpha (0 = original, 1 = relay)")
    ax.set_ylabel(metric)
    ax.set_xticks(sorted(allb.index))
    ax.set_title(f"{'phase replay' if source == 'replay' else 'forward'}: gold share vs alpha\n{point_label}",
                 fontsize=8.5, pad=12)
    ax.legend(loc="best", fontsize=7)


@_register("alignment", "figure", "Alignment: right-aligned relay vs left-aligned rank_sync", _needs_rank_sync)
def alignment(tables: dict) -> Figure:
    scores = _accuracy_scores(tables)
    means = accuracy_means(scores, ["selector", "condition"])
    conditions = plots.condition_order(scores["condition"].unique())
    selectors = sorted(scores["selector"].unique())
    probes = _table(tables, "probes")
    share = _evidence_share(probes)
    panels = 2 + (not share.empty)
    fig = Figure(figsize=(3.6 * panels, 3.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, metric in zip(axes[:2], METRICS):
        sub = means[means["metric"] == metric]
        plots.interval_bars(ax, sub, "selector", hue="condition", order=selectors,
                            hue_order=[c for c in conditions if c in set(sub["condition"])])
        ax.set_ylabel(_metric_label(metric))
        ax.set_title(_metric_label(metric))
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="best")
    if not share.empty:
        num_layers = int(probes["layer"].max()) + 1
        per_layer = share.groupby(["condition", "layer"])["value"].mean().reset_index()
        plots.layer_lines(axes[2], per_layer, conditions, num_layers)
        axes[2].set_ylabel("evidence_share")
        axes[2].set_title("evidence attention share (final question token)", pad=12)
        axes[2].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel(f"{_units_note(scores)}; error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig


# ------------------------------------------------------------------------------------------------ run drawing

def _spec_figures(manifest: dict) -> list[str] | None:
    spec = (manifest.get("config") or {}).get("spec") or {}
    names = spec.get("figures")
    return list(names) if names else None


def select_figures(tables: dict, manifest: dict | None = None, only: str | Sequence[str] | None = None,
                   all_supported: bool = False) -> list[str]:
    """The entries to draw: ``only`` (a name, comma-separated names or a list); else the analysis's ``SPEC.figures`` (from the manifest) with companions;
    else (or with ``all_supported``) every entry the tables support."""
    _check_not_empty(tables)
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()] if isinstance(only, str) else list(only)
        for name in names:
            reason = supported(tables, name)
            if reason:
                raise FigureError(f"cannot build {name}: {reason}")
        return names
    spec = None if all_supported else _spec_figures(manifest or {})
    if spec:
        names = []
        for name in spec:
            names += [name] + list(COMPANIONS.get(name, ()))
        names = [n for n in dict.fromkeys(names) if n in REGISTRY and supported(tables, n) is None]
        if names:
            return names
    return [n for n in REGISTRY if supported(tables, n) is None]


def write_entry(name: str, tables: dict, out_dir: str | Path, formats: Sequence[str] = plots.FORMATS) -> list[Path]:
    """Build one entry and write it: figures as ``name.<fmt>``, tables as ``name.csv`` and ``name.md``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = build(name, tables)
    if isinstance(result, pd.DataFrame):
        csv, md = out_dir / f"{name}.csv", out_dir / f"{name}.md"
        csv.write_text(result.to_csv(index=False, float_format="%.6g", lineterminator="\n"), encoding="utf-8")
        md.write_text(f"**{REGISTRY[name].title}**\n\n" + table_markdown(result), encoding="utf-8")
        return [csv, md]
    return plots.save_figure(result, out_dir / name, formats)


def write_figures(run_dir: str | Path, only: str | Sequence[str] | None = None,
                  formats: Sequence[str] = plots.FORMATS, all_supported: bool = False,
                  progress: Callable[[str], None] | None = None) -> list[Path]:
    """Draw the run's figures/tables into ``RUN_DIR/figures/`` (see :func:`select_figures`); returns the files."""
    from relaylens.results import RunStore, load_tables

    for fmt in formats:
        if fmt not in plots.FORMATS:
            raise FigureError(f"unknown figure format {fmt!r}; choose from {', '.join(plots.FORMATS)}")
    run_dir = Path(run_dir)
    manifest = RunStore.open(run_dir).manifest
    tables = load_tables(run_dir)
    names = select_figures(tables, manifest, only, all_supported)
    paths = []
    for name in names:
        if progress:
            progress(name)
        paths += write_entry(name, tables, run_dir / "figures", formats)
    index = {"analysis": manifest.get("analysis"), "entries": names,
             "files": [p.name for p in paths]}
    (run_dir / "figures" / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return paths
