"""The report's layer x head heat maps: the change of one probe readout vs ``original`` (pp), one panel per
condition. Not a paper figure (not in the registry); :mod:`relaylens.reporting.report` embeds it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.summaries import REFERENCE, condition_order

HEATMAP_METRIC = ("question_final", "forward", "evidence_share")
"""The readout the heat maps show: (probe_point, source, metric)."""


def evidence_heatmap(probes: pd.DataFrame, readout: tuple[str, str, str] = HEATMAP_METRIC) -> Figure | None:
    """Layer x head heat maps of ``readout`` minus original (pp), one panel per other condition; None when the
    probes hold no such readout or no condition besides original. Build and save it inside :func:`plots.style`."""
    point, source, metric = readout
    data = probes[(probes["probe_point"] == point) & (probes["source"] == source) & (probes["metric"] == metric)]
    if data.empty or REFERENCE not in set(data["condition"]):
        return None
    grid = data.groupby(["condition", "layer", "head"])["value"].mean().unstack(["layer", "head"])
    delta = 100 * (grid - grid.loc[REFERENCE])
    conditions = [c for c in condition_order(grid.index) if c != REFERENCE]
    if not conditions:
        return None
    num_layers, num_heads = int(probes["layer"].max()) + 1, int(probes["head"].max()) + 1
    mats = {c: delta.loc[c].reindex(pd.MultiIndex.from_product([range(num_layers), range(num_heads)]))
            .to_numpy().reshape(num_layers, num_heads) for c in conditions}  # per condition [layer, head]
    finite = np.concatenate([np.abs(m[np.isfinite(m)]) for m in mats.values()])
    vmax = float(np.quantile(finite, 0.99)) if finite.size else 0.0  # robust scale: one head cannot wash out the rest
    vmax = vmax if vmax > 0 else 1.0
    cols = min(len(conditions), 4)
    rows = math.ceil(len(conditions) / cols)
    fig = Figure(figsize=(2.6 * cols + 0.8, max(2.4, 0.11 * num_layers + 1.0) * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, cond in zip(axes.flat, conditions):
        image = plots.heatmap(ax, mats[cond], f"{cond} - original", vmax=vmax)
    for ax in list(axes.flat)[len(conditions):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes, shrink=0.8, label="evidence share change (pp)", extend="both")
    return fig
