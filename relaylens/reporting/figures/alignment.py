"""Alignment (``relaylens/analyses/alignment.py``): right-aligned relay vs left-aligned rank_sync, accuracy per selector
and the per-layer evidence share."""

from __future__ import annotations

from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_rank_sync, register
from relaylens.reporting.summaries import (
    accuracy_means,
    accuracy_scores,
    condition_order,
    forward_evidence_share,
    metric_list,
)
from relaylens.results.tables import get_table


@register("alignment", "figure", "Alignment: right-aligned relay vs left-aligned rank_sync", needs_rank_sync)
def alignment(tables: dict) -> Figure:
    scores = accuracy_scores(tables)
    means = accuracy_means(scores, ["selector", "condition"])
    conditions = condition_order(scores["condition"].unique())
    selectors = sorted(scores["selector"].unique())
    probes = get_table(tables, "probes")
    share = forward_evidence_share(probes)
    metrics = metric_list(means)
    n = len(metrics)
    panels = n + (not share.empty)
    fig = Figure(figsize=(3.6 * panels, 3.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, metric in zip(axes[:n], metrics):
        sub = means[means["metric"] == metric]
        plots.interval_bars(ax, sub, "selector", hue="condition", order=selectors,
                            hue_order=[c for c in conditions if c in set(sub["condition"])])
        ax.set_ylabel(plots.metric_label(metric))
        ax.set_title(plots.metric_label(metric))
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="best")
    if not share.empty:
        num_layers = int(probes["layer"].max()) + 1
        per_layer = share.groupby(["condition", "layer"])["value"].mean().reset_index()
        plots.layer_lines(axes[n], per_layer, conditions, num_layers)
        axes[n].set_ylabel("evidence_share")
        axes[n].set_title("evidence attention share (final question token)", pad=12)
        axes[n].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel(f"{plots.units_note(scores)}; error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig
