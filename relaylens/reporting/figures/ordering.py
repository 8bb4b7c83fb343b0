"""Figure 5 (``relaylens/analyses/ordering.py``): source / score / reverse order and RandomMean (the mean over
``random_order(seed)``), with the seed spread, paired differences vs relay and evidence-share band deltas."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_ordering, register
from relaylens.reporting.summaries import (
    REFERENCE,
    accuracy_means,
    accuracy_scores,
    condition_order,
    forward_evidence_share,
    metric_list,
    paired_deltas,
    quantity_list,
    record_evidence_share_pp,
    with_random_mean,
)
from relaylens.results.tables import get_table


@register("figure5", "figure", "Figure 5: slot ordering (RandomMean = mean over random_order seeds)", needs_ordering)
def figure5(tables: dict) -> Figure:
    scores = with_random_mean(accuracy_scores(tables))
    main = scores[~scores["condition"].str.match(r"random_order\(.*\)$")]
    means = accuracy_means(main, ["condition"])
    seeds = scores[scores["condition"].str.match(r"random_order\(.*\)$")]
    seed_means = seeds.groupby(["metric", "condition"])["value"].mean().reset_index()
    conditions = condition_order(main["condition"].unique())
    reference = "relay" if "relay" in conditions else REFERENCE
    deltas = paired_deltas(main, [], reference=reference)
    share = forward_evidence_share(get_table(tables, "probes"))
    if not share.empty:  # RandomMean of the readouts too: mean over seeds per (unit, layer, head)
        rnd = share[share["condition"].str.match(r"random_order\(.*\)$")]
        keys = ["record_id", "selector", "budget", "probe_point", "source", "layer", "head", "metric"]
        mean = rnd.groupby(keys, sort=True)["value"].mean().reset_index().assign(condition="RandomMean")
        share = pd.concat([share.drop(rnd.index), mean[share.columns]], ignore_index=True)
    metrics = metric_list(means)
    n = len(metrics)
    fig = Figure(figsize=(3.5 * (n + 1 + (not share.empty)), 3.3), layout="constrained")
    axes = fig.subplots(1, n + 1 + (not share.empty), squeeze=False)[0]
    for ax, metric in zip(axes[:n], metrics):
        centres = plots.condition_bars(ax, means, metric, conditions)
        sm = seed_means[seed_means["metric"] == metric]
        if ("RandomMean", None) in centres and not sm.empty:
            x = centres[("RandomMean", None)]
            offsets = np.linspace(-0.22, 0.22, len(sm)) if len(sm) > 1 else np.zeros(1)
            ax.scatter(x + offsets, sm["value"], s=10, color="#222222", zorder=4, label="per seed")
            spread = f"seeds: {sm['value'].min():.2f}-{sm['value'].max():.2f} (sd {sm['value'].std(ddof=0):.3f})"
            ax.text(0.98, 0.98, spread, transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#333333")
            ax.legend(loc="upper left")
        ax.set_title(plots.metric_label(metric))
        ax.set_ylim(0, max(1.05, ax.get_ylim()[1] * 1.15))
    plots.delta_points(axes[n], deltas, [c for c in conditions if c != reference], reference)
    axes[n].set_title(f"paired difference vs {reference} (source order)" if reference == "relay"
                      else f"paired difference vs {reference}")
    if not share.empty:
        plots.band_delta_panel(axes[n + 1], share, conditions, reference)
    n_seeds = seeds["condition"].nunique()
    fig.supxlabel(f"{plots.units_note(scores)}; RandomMean over {n_seeds} seed{'s' if n_seeds != 1 else ''}; "
                  "error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig


def _ordering_rows(tables: dict) -> pd.DataFrame:
    """Per-record rows of the accuracy metric(s) and ``evidence_share_pp``, random orders folded into
    ``RandomMean``."""
    scores = with_random_mean(accuracy_scores(tables))
    evidence = record_evidence_share_pp(tables)
    parts = [scores[["record_id", "selector", "budget", "condition", "cluster_id", "metric", "value"]]]
    rows = pd.concat(parts + ([with_random_mean(evidence)] if len(evidence) else []), ignore_index=True)
    return rows[~rows["condition"].str.match(r"random_order\(.*\)$")]


def ordering_table(tables: dict) -> pd.DataFrame:
    """One row per (quantity, condition: original, relay, score / reverse order, ``RandomMean``): the mean with its
    interval, and the paired differences vs ``original`` and vs ``relay`` (source order) with theirs; 95% cluster
    bootstrap. The numbers of Figure 5 (paper: RandomMean +7.5 pp over Original, RoPERelay +7.0 pp more)."""
    rows = _ordering_rows(tables)
    quantities = quantity_list(rows)
    means = accuracy_means(rows, ["condition"], metrics=quantities)
    out = (means.rename(columns={"metric": "quantity", "low": "mean_low", "high": "mean_high"})
           [["quantity", "condition", "n", "mean", "mean_low", "mean_high"]])
    for reference in (REFERENCE, "relay"):
        if reference not in set(rows["condition"]):
            continue
        d = paired_deltas(rows, [], reference=reference, metrics=quantities)
        names = {"metric": "quantity", "mean": f"vs_{reference}", "low": f"vs_{reference}_low",
                 "high": f"vs_{reference}_high"}
        d = d[d["condition"] != reference].rename(columns=names)
        out = out.merge(d[["quantity", "condition", f"vs_{reference}", f"vs_{reference}_low", f"vs_{reference}_high"]],
                        on=["quantity", "condition"], how="left")
    order = {c: i for i, c in enumerate(condition_order([c for c in out["condition"].unique() if c != "RandomMean"])
                                        + ["RandomMean"])}
    rank = {q: i for i, q in enumerate(quantities)}
    out = out.assign(_q=out["quantity"].map(rank), _c=out["condition"].map(order)).sort_values(["_q", "_c"])
    return out.drop(columns=["_q", "_c"]).reset_index(drop=True)


@register("ordering_table", "table", "Figure 5's numbers: per condition (RandomMean over seeds) the mean and the "
          "paired differences vs original and vs relay, accuracy and evidence share (pp)", needs_ordering)
def ordering_numbers(tables: dict) -> pd.DataFrame:
    return ordering_table(tables)
