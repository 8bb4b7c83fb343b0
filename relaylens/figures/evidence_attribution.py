"""Figure 6's companion (``analyses/evidence_reading.py`` with ``attribution=True``): how much of the answer the
evidence carries, per layer, under original / half_gap / relay — the gold share of |gradient x input|, gradient x
input summed over gold states, and the direct logit attribution of the gold states beside that of all retained
states (:mod:`relaylens.attribution`), at the final question token and the teacher-forced first answer token."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from relaylens import plots
from relaylens.figures.evidence_reading import FIGURE6_CONDITIONS, PROBE_POINTS, annotate_band_deltas
from relaylens.figures.registry import register
from relaylens.summaries import SHARE_METRICS, condition_order
from relaylens.tables import get_table

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
            ax = axes[i, j]
            data = probes[(probes["probe_point"] == point) & (probes["metric"] == metric)
                          & probes["condition"].isin(conditions)]
            if data.empty:
                plots.note_axis(ax, f"no {label}\nat the {point_label}")
                continue
            per_layer = data.groupby(["condition", "layer"])["value"].mean().reset_index()
            plots.layer_lines(ax, per_layer, conditions, num_layers)
            if metric not in SHARE_METRICS:
                ax.axhline(0.0, color="#888888", lw=0.6, zorder=1)
            annotate_band_deltas(ax, data, num_layers, conditions, metric in SHARE_METRICS)
            ax.set_title(f"{label}\n{point_label}", fontsize=8.5, pad=12)
            ax.set_ylabel(metric, fontsize=7)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    ordered = [c for c in conditions if c in handles]
    fig.legend([handles[c] for c in ordered], ordered, loc="outside upper center", ncols=max(1, min(len(ordered), 6)))
    n = probes["record_id"].nunique()
    fig.supxlabel(f"{n} record{'s' if n != 1 else ''}; mean over records and heads; target: the correct first answer "
                  "token (the answer's next token at the teacher-forced point); logit attribution with the final "
                  "norm's scale frozen; numbers: band mean minus original (pp for shares)", fontsize=7, color="#555555")
    return fig
