"""Figure 4 (``relaylens/analyses/coordinate_ablation.py``): per-condition means, paired differences vs original and the
evidence-share band deltas."""

from __future__ import annotations

from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_other_conditions, register
from relaylens.reporting.summaries import (
    REFERENCE,
    accuracy_means,
    accuracy_scores,
    condition_order,
    forward_evidence_share,
    metric_list,
    paired_deltas,
)
from relaylens.results.tables import get_table


@register("figure4", "figure", "Figure 4: coordinate ablation (means and paired differences vs original)",
          needs_other_conditions)
def figure4(tables: dict) -> Figure:
    scores = accuracy_scores(tables)
    means = accuracy_means(scores, ["condition"])
    deltas = paired_deltas(scores, [])
    conditions = condition_order(scores["condition"].unique())
    share = forward_evidence_share(get_table(tables, "probes"))
    metrics = metric_list(means)
    n = len(metrics)
    panels = n + 1 + (not share.empty)
    fig = Figure(figsize=(3.3 * panels, 3.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, metric in zip(axes[:n], metrics):
        plots.condition_bars(ax, means, metric, conditions)
        ax.set_title(plots.metric_label(metric))
    plots.delta_points(axes[n], deltas, [c for c in conditions if c != REFERENCE], REFERENCE)
    axes[n].set_title(f"paired difference vs {REFERENCE}")
    if not share.empty:
        plots.band_delta_panel(axes[n + 1], share, conditions, REFERENCE)
    fig.supxlabel(f"{plots.units_note(scores)}; error bars: 95% cluster bootstrap", fontsize=7, color="#555555")
    return fig
