"""Figure 3 (``relaylens/analyses/budget_curves.py``): accuracy vs retention budget, one panel per selector, original vs
relay, shaded 95% cluster-bootstrap intervals."""

from __future__ import annotations

from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_budgets, register
from relaylens.reporting.summaries import accuracy_means, accuracy_scores, budget_label, condition_order, metric_list


@register("figure3", "figure", "Figure 3: accuracy vs retention budget, one panel per selector", needs_budgets)
def figure3(tables: dict) -> Figure:
    scores = accuracy_scores(tables)
    means = accuracy_means(scores, ["selector", "budget", "condition"])
    selectors = sorted(means["selector"].unique())
    present = set(means["condition"])
    conditions = [c for c in ("original", "relay") if c in present]
    conditions = conditions if len(conditions) == 2 else condition_order(present)
    metrics = metric_list(means)
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
            ax.set_xticks(budgets, [budget_label(b) for b in budgets])
            ax.minorticks_off()
            if i == 0:
                ax.set_title(sel)
            if i == len(metrics) - 1:
                ax.set_xlabel("retention budget")
            if j == 0:
                ax.set_ylabel(plots.metric_label(metric))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=max(1, min(len(labels), 5)))
    fig.supxlabel(f"{plots.units_note(scores)}; shaded: 95% cluster-bootstrap interval", fontsize=7, color="#555555")
    return fig
