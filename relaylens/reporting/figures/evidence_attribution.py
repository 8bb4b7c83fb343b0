"""Figure 6's companion (``relaylens/analyses/evidence_reading.py`` with ``attribution=True``): how much of the answer
the evidence carries, per layer, under original / half_gap / relay — the gold share of |gradient x input|, gradient x
input summed over gold states, and the direct logit attribution of the gold states beside that of all retained states
(:mod:`relaylens.probes.attribution`), at the final question token and the teacher-forced first answer token."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.evidence_reading import FIGURE6_CONDITIONS, PROBE_POINTS, layer_panel
from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import SHARE_METRICS, condition_order
from relaylens.results.tables import get_table

ATTRIBUTION_PANELS = (("evidence_grad_x_input_share", "gold share of |gradient x input|"),
                      ("evidence_grad_x_input", "gradient x input, gold states"),
                      ("evidence_logit_contribution", "direct logit attribution, gold states"),
                      ("history_logit_contribution", "direct logit attribution, all retained"))


def needs_attribution(tables: dict) -> str | None:
    """Why the attribution figure cannot be drawn, or None."""
    probes = get_table(tables, "probes")
    if not len(probes) or not probes["metric"].isin([m for m, _ in ATTRIBUTION_PANELS]).any():
        return "no attribution readouts in the probes table (evidence_reading with attribution=True writes them)"
    return None


def _zero_line(ax, per_layer: pd.DataFrame) -> None:
    ax.axhline(0.0, color="#888888", lw=0.6, zorder=1)


@register("figure6_attribution", "figure", "Figure 6 (companion): attribution of the answer to the evidence per layer",
          needs_attribution)
def figure6_attribution(tables: dict) -> Figure:
    probes = get_table(tables, "probes")
    probes = probes[(probes["source"] == "forward") & probes["metric"].isin([m for m, _ in ATTRIBUTION_PANELS])]
    num_layers = int(probes["layer"].max()) + 1
    points = [(p, label) for p, label in PROBE_POINTS if (probes["probe_point"] == p).any()]
    present = set(probes["condition"])
    conditions = [c for c in FIGURE6_CONDITIONS if c in present] or condition_order(present)
    fig = Figure(figsize=(13.0, 2.9 * len(points) + 0.4), layout="constrained")
    axes = fig.subplots(len(points), len(ATTRIBUTION_PANELS), squeeze=False)
    for i, (point, point_label) in enumerate(points):
        for j, (metric, label) in enumerate(ATTRIBUTION_PANELS):
            data = probes[(probes["probe_point"] == point) & (probes["metric"] == metric)
                          & probes["condition"].isin(conditions)]
            layer_panel(axes[i, j], data, conditions, num_layers, metric, f"{label}\n{point_label}",
                        f"no {label}\nat the {point_label}", decorate=None if metric in SHARE_METRICS else _zero_line,
                        ylabel_size=7)
    plots.condition_legend(fig, axes, conditions)
    n = probes["record_id"].nunique()
    fig.supxlabel(f"{n} record{'s' if n != 1 else ''}; mean over records and heads; target: the correct first answer "
                  "token (the answer's next token at the teacher-forced point); logit attribution with the final "
                  "norm's scale frozen; numbers: band mean minus original (pp for shares)", fontsize=7, color="#555555")
    return fig
