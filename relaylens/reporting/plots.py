"""Shared figure style, byte-stable saving, plotting primitives and the panels several figures share
(matplotlib Agg + seaborn), torch-free and byte-deterministic. Numbers come from :mod:`relaylens.reporting.summaries`.

Every figure of :mod:`relaylens.reporting.figures` is drawn inside :func:`style` and written by :func:`save_figure`,
which fixes everything that would otherwise change between runs: PNG/PDF/SVG metadata (no software version, no dates),
``svg.hashsalt`` (ids of clip paths), ``SOURCE_DATE_EPOCH`` (PDF dates) and the font. Running the same figure twice
gives byte-identical files.

Axes: ``layer``, ``head``, ``band`` (early / middle / late thirds of the layers; :mod:`relaylens.geometry`).

Example:
    >>> condition_color("random_order(0)") == condition_color("RandomMean")
    True
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import re
from pathlib import Path
from typing import Iterator, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from relaylens.conditions.bands import bands
from relaylens.errors import RelaylensError
from relaylens.reporting.summaries import band_table, budget_label, condition_family, metric_list
from relaylens.results.atomic import write_atomic

__all__ = ["style", "save_figure", "figure_png_base64", "condition_color", "shade_bands", "interval_bars",
           "layer_lines", "heatmap", "note_axis", "FORMATS", "BAND_SHADES", "metric_label", "units_note",
           "condition_bars", "delta_points", "band_delta_panel"]

FORMATS = ("png", "pdf", "svg")
"""Figure file formats :func:`save_figure` writes."""

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.08,
    "svg.hashsalt": "relaylens",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
    "path.simplify": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
    "svg": {"Creator": None, "Date": None, "Format": None, "Type": None},
}
SOURCE_DATE_EPOCH = "0"

_PALETTE = {
    "original": "#4d4d4d", "relay": "#1f77b4", "half_gap": "#ff7f0e", "key_only": "#2ca02c",
    "query_only": "#d62728", "common_shift": "#9467bd", "rank_sync": "#8c564b", "score_order": "#e377c2",
    "reverse_order": "#17becf", "random_order": "#bcbd22", "RandomMean": "#bcbd22", "compaction": "#7f7f7f",
    "learned": "#e6550d", "geometry": "#fdae6b",
}
BAND_COLORS = {"early": "#f2f2f2", "middle": "#e3ebf5", "late": "#f2f2f2"}
BAND_SHADES = {"early": "#9ecae1", "middle": "#4292c6", "late": "#08519c"}
"""Line / bar colours of the early, middle and late bands."""

_SEED_SHADES = ("#bcbd22", "#8c8d12", "#d6d75a", "#6b6c0e", "#e5e68f")


def condition_color(condition: str) -> str:
    """A fixed colour per condition family; ``random_order(seed)`` gets olive shades by seed."""
    family = condition_family(condition)
    seed = re.fullmatch(r"random_order\((\d+)\)", str(condition))
    if seed:
        return _SEED_SHADES[int(seed.group(1)) % len(_SEED_SHADES)]
    return _PALETTE.get(family, "#7f7f7f")


def rc() -> dict:
    """The shared style: seaborn ``whitegrid`` axes and ``paper`` context, then :data:`RC` on top."""
    import seaborn as sns  # noqa: PLC0415 - import cost: seaborn loads on first use

    return {**sns.axes_style("whitegrid"), **sns.plotting_context("paper"), **RC}


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Apply the shared relaylens style for the ``with`` block (global rcParams restored afterwards).

    Figures are built as :class:`matplotlib.figure.Figure` objects (no pyplot state, no GUI backend needed; they
    render with Agg and display inline in Jupyter).
    """
    with matplotlib.rc_context(rc()):
        yield


def save_figure(fig: Figure, stem: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``fig`` as ``stem.<fmt>`` for each format with fixed metadata (byte-stable); returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = previous or SOURCE_DATE_EPOCH
    paths = []
    try:
        with matplotlib.rc_context(rc()):
            for fmt in formats:
                if fmt not in METADATA:
                    raise RelaylensError(f"unknown figure format {fmt!r}; choose from {', '.join(FORMATS)}. Fix: "
                                         "pass formats from that list")
                path = stem.with_suffix(f".{fmt}")
                buf = io.BytesIO()
                fig.savefig(buf, format=fmt, metadata=METADATA[fmt])
                write_atomic(path, buf.getvalue())  # a full disk keeps the previous file
                paths.append(path)
    finally:
        if previous is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
    return paths


def figure_png_base64(fig: Figure, dpi: int = 110) -> str:
    """``fig`` as a base64 PNG (for ``<img src="data:image/png;base64,...">``), fixed metadata."""
    buf = io.BytesIO()
    with matplotlib.rc_context(rc()):
        fig.savefig(buf, format="png", dpi=dpi, metadata=METADATA["png"])
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ------------------------------------------------------------------------------------------------- primitives

def shade_bands(ax: Axes, num_layers: int, label: bool = True) -> None:
    """Shade the early / middle / late layer bands behind the data and name them along the top edge."""
    for name, layers in bands(num_layers).items():
        if not layers:
            continue
        lo, hi = layers[0] - 0.5, layers[-1] + 0.5
        ax.axvspan(lo, hi, color=BAND_COLORS[name], zorder=0, lw=0)
        if label:
            ax.text((lo + hi) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=7, color="#555555")
    ax.set_xlim(-0.5, num_layers - 0.5)


def interval_bars(ax: Axes, frame: pd.DataFrame, x: str, hue: str | None = None, order: Sequence | None = None,
                  hue_order: Sequence | None = None, colors: dict | None = None, width: float = 0.8) -> dict:
    """Bars of ``mean`` with ``low``/``high`` error bars; ``frame`` has columns ``x, [hue], mean, low, high``.

    Returns ``{(x, hue): bar centre}`` so callers can overlay points.
    """
    order = list(order if order is not None else dict.fromkeys(frame[x]))
    hues = [None] if hue is None else list(hue_order if hue_order is not None else dict.fromkeys(frame[hue]))
    step = width / len(hues)
    centres, labelled = {}, set()
    for j, h in enumerate(hues):
        sub = frame if h is None else frame[frame[hue] == h]
        for i, xv in enumerate(order):
            row = sub[sub[x] == xv]
            if row.empty:
                continue
            mean, low, high = (float(row[c].iloc[0]) for c in ("mean", "low", "high"))
            pos = i - width / 2 + step * (j + 0.5)
            key = xv if h is None else h
            color = (colors or {}).get(key, condition_color(str(key)))
            label = None if h is None or h in labelled else str(h)
            labelled.add(h)
            ax.bar(pos, mean, step * 0.92, color=color, label=label, zorder=2)
            if np.isfinite(low) and np.isfinite(high):
                ax.errorbar(pos, mean, yerr=[[max(mean - low, 0)], [max(high - mean, 0)]], fmt="none",
                            ecolor="#222222", elinewidth=1, capsize=2.5, zorder=3)
            centres[(xv, h)] = pos
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([str(o) for o in order], rotation=30, ha="right")
    return centres


def layer_lines(ax: Axes, frame: pd.DataFrame, conditions: Sequence[str], num_layers: int) -> None:
    """One line per condition of ``value`` against ``layer`` (``frame``: columns condition, layer, value)."""
    shade_bands(ax, num_layers)
    for cond in conditions:
        sub = frame[frame["condition"] == cond].sort_values("layer")
        if sub.empty:
            continue
        ax.plot(sub["layer"], sub["value"], color=condition_color(cond), lw=1.4, marker="o", ms=2.2, label=cond,
                zorder=3)
    ax.set_xlabel("layer")


def condition_legend(fig: Figure, axes, conditions: Sequence[str]) -> None:
    """One legend above the figure: the conditions (in ``conditions`` order) that some panel of ``axes`` drew."""
    handles = {}
    for ax in np.asarray(axes).flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    ordered = [c for c in conditions if c in handles]
    fig.legend([handles[c] for c in ordered], ordered, loc="outside upper center", ncols=max(1, min(len(ordered), 6)))


def heatmap(ax: Axes, matrix: np.ndarray, title: str, vmax: float | None = None, cmap: str = "RdBu_r",
            xlabel: str = "head", ylabel: str = "layer") -> matplotlib.image.AxesImage:
    """A diverging layer x head heat map centred at zero; returns the image (for a colour bar)."""
    finite = np.abs(matrix[np.isfinite(matrix)])
    vmax = vmax if vmax is not None else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
    image = ax.imshow(matrix, aspect="auto", cmap=cmap, vmin=-vmax, vmax=vmax, interpolation="nearest", origin="upper")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    return image


def note_axis(ax: Axes, text: str) -> None:
    """An empty panel that says why it is empty."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, color="#666666", wrap=True, transform=ax.transAxes)


# ------------------------------------------------------------------------------------------------- shared panels

def metric_label(metric: str) -> str:
    """Axis label of an accuracy metric."""
    labels = {"contains": "accuracy (contains)", "f1": "F1", "judge": "judge accuracy",
              "choice_accuracy": "choice accuracy", "exact_match": "exact match"}
    return labels.get(metric, metric.replace("judge_", "judge accuracy: ") if metric.startswith("judge_") else metric)


def units_note(scores: pd.DataFrame) -> str:
    """``'N records; selectors @ budgets'`` for a figure's footnote."""
    n = scores[["record_id"]].drop_duplicates().shape[0]
    sel = ", ".join(sorted(scores["selector"].unique()))
    bud = ", ".join(budget_label(b) for b in sorted(scores["budget"].unique()))
    return f"{n} record{'s' if n != 1 else ''}; {sel} @ {bud}"


def condition_bars(ax: Axes, means: pd.DataFrame, metric: str, conditions: list[str]) -> dict:
    """Bars of each condition's mean ``metric`` with intervals (``means`` from ``summaries.accuracy_means``)."""
    sub = means[means["metric"] == metric]
    centres = interval_bars(ax, sub, "condition", order=[c for c in conditions if c in set(sub["condition"])])
    ax.set_ylabel(metric_label(metric))
    ax.set_ylim(bottom=0)
    return centres


def delta_points(ax: Axes, deltas: pd.DataFrame, conditions: list[str], reference: str) -> None:
    """Paired differences vs ``reference`` with intervals, one marker per metric (``summaries.paired_deltas``)."""
    shapes = ("o", "s", "D", "^", "v")
    order = [c for c in conditions if c in set(deltas["condition"])]
    present = metric_list(deltas)
    markers = {m: shapes[k % len(shapes)] for k, m in enumerate(present)}
    for k, metric in enumerate(present):
        sub = deltas[deltas["metric"] == metric]
        for i, cond in enumerate(order):
            r = sub[sub["condition"] == cond]
            if r.empty:
                continue
            mean, low, high = (float(r[c].iloc[0]) for c in ("mean", "low", "high"))
            x = i + (k - (len(present) - 1) / 2) * 0.25
            ax.errorbar(x, mean, yerr=[[max(mean - low, 0)], [max(high - mean, 0)]], fmt=markers[metric], ms=4,
                        color=condition_color(cond), ecolor="#333333", elinewidth=1, capsize=2, zorder=3)
    ax.axhline(0, color="#999999", lw=0.8, zorder=1)
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.set_ylabel(f"minus {reference} (paired)")
    ax.legend([Line2D([], [], marker=markers[m], color="#555555", ls="none") for m in present], present, loc="best")


def band_delta_panel(ax: Axes, share: pd.DataFrame, conditions: list[str], reference: str) -> None:
    """Bars of each condition's evidence-share band mean minus ``reference`` (pp), early / middle / late."""
    num_layers = int(share["layer"].max()) + 1
    bt = band_table(share, num_layers, [], reference=reference)
    bt = bt[bt["condition"] != reference]
    order = [c for c in conditions if c in set(bt["condition"])]
    interval_bars(ax, bt.assign(mean=bt["delta_pp"], low=np.nan, high=np.nan), "condition", hue="band",
                  order=order, hue_order=["early", "middle", "late"], colors=BAND_SHADES)
    ax.axhline(0, color="#999999", lw=0.8)
    ax.set_ylabel(f"evidence share, pp vs {reference}")
    ax.set_title("evidence attention share by band")
    ax.legend(loc="best")
