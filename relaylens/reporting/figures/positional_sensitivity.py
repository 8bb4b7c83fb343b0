"""Figure ``positional_sensitivity`` (``relaylens/analyses/positional_sensitivity.py``, and ``learned_geometry``'s test
records): layer x kv head heat maps of ``d log p(first answer token) / d b`` (left) and ``/ d s`` (right), mean over
records, one row per condition (:mod:`relaylens.probes.sensitivity`). Red: the model wants that head's keys further
from the question (``b``) or its gaps wider (``s``); blue: closer / narrower. Each column shares one colour scale,
clipped at the 99th percentile of its magnitudes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import condition_order
from relaylens.results.tables import SENSITIVITY_METRICS, get_table

TITLES = {"positional_sensitivity_b": "d log p / d b", "positional_sensitivity_s": "d log p / d s"}


def needs_sensitivity(tables: dict) -> str | None:
    """Why the figure cannot be drawn (no sensitivity readouts), or None."""
    probes = get_table(tables, "probes")
    if not len(probes) or not probes["metric"].isin(SENSITIVITY_METRICS).any():
        return "no positional sensitivity readouts in the probes table (an analysis with sensitivity=True writes them)"
    return None


def sensitivity_grids(probes: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """``(condition, metric) -> [layer, kv_head]`` mean over records."""
    data = probes[probes["metric"].isin(SENSITIVITY_METRICS)]
    layers, heads = int(data["layer"].max()) + 1, int(data["head"].max()) + 1
    means = data.groupby(["condition", "metric", "layer", "head"])["value"].mean()
    grids = {}
    for (condition, metric), g in means.groupby(level=["condition", "metric"]):
        grid = np.full((layers, heads), np.nan)
        for (_, _, layer, head), value in g.items():
            grid[int(layer), int(head)] = value
        grids[(condition, metric)] = grid
    return grids


@register("positional_sensitivity", "figure", "Positional sensitivity: d log p / d b and d / d s per layer x kv head",
          needs_sensitivity)
def positional_sensitivity(tables: dict) -> Figure:
    probes = get_table(tables, "probes")
    grids = sensitivity_grids(probes)
    conditions = condition_order({c for c, _ in grids})
    fig = Figure(figsize=(8.0, 0.9 + 2.6 * len(conditions)), layout="constrained")
    axes = fig.subplots(len(conditions), 2, squeeze=False)
    for column, metric in enumerate(SENSITIVITY_METRICS):
        mats = [grids.get((c, metric)) for c in conditions]
        finite = np.concatenate([np.abs(m[np.isfinite(m)]) for m in mats if m is not None] or [np.zeros(0)])
        vmax = float(np.quantile(finite, 0.99)) if finite.size and finite.max() > 0 else 1.0
        image = None
        for row, (condition, mat) in enumerate(zip(conditions, mats)):
            ax = axes[row, column]
            if mat is None:
                plots.note_axis(ax, f"no {metric} for {condition}")
                continue
            image = plots.heatmap(ax, mat, f"{condition}: {TITLES[metric]}", vmax=vmax, xlabel="kv head")
            ax.set_xticks(range(mat.shape[1]))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if image is not None:
            fig.colorbar(image, ax=axes[:, column], shrink=0.8, extend="both")
    n = probes[probes["metric"].isin(SENSITIVITY_METRICS)]["record_id"].nunique()
    fig.supxlabel(f"{n} record{'s' if n != 1 else ''}; mean over records; gradient of the first answer token's "
                  "log-probability", fontsize=7, color="#555555")
    return fig
