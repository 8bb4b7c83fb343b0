"""Figure 6 and the layer-band table (``relaylens/analyses/evidence_reading.py``): how each layer reads the retained
gold evidence under original / half_gap / relay (phase-replay gold share, evidence attention share, evidence value
norm), the compaction(alpha) curve per band, and the band table behind it (deltas vs original; pp for shares)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from relaylens.conditions.bands import band_of, bands
from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_probes, register
from relaylens.reporting.summaries import REFERENCE, SHARE_METRICS, alpha_of, band_table, condition_order
from relaylens.results.tables import SWEEP_SOURCE, get_table

EVIDENCE_PANELS = (("replay", "replay_gold_share", "phase-replay gold share"),
                   ("forward", "evidence_share", "evidence attention share"),
                   ("forward", "evidence_value_norm", "evidence value norm"))
FIGURE6_CONDITIONS = ("original", "half_gap", "relay")
PROBE_POINTS = (("question_final", "final question token"),
                ("first_answer_token", "first answer token (teacher-forced)"))


@register("layer_bands", "table", "Layer-band table: evidence reading by early / middle / late band (deltas vs "
          "original; pp for shares)", needs_probes)
def layer_bands(tables: dict) -> pd.DataFrame:
    probes = get_table(tables, "probes")
    probes = probes[probes["source"] != SWEEP_SOURCE]  # the layer sweep has its own figure (layer_scope)
    num_layers = int(probes["layer"].max()) + 1
    keys = ["selector", "probe_point", "source"]
    pooled = band_table(probes.assign(selector="all"), num_layers, keys)
    per_selector = band_table(probes, num_layers, keys) if probes["selector"].nunique() > 1 else pooled.iloc[:0]
    out = pd.concat([pooled, per_selector], ignore_index=True)
    band_rank = {"early": 0, "middle": 1, "late": 2}
    cond_rank = {c: i for i, c in enumerate(condition_order(out["condition"]))}
    point_rank = {p: i for i, (p, _) in enumerate(PROBE_POINTS)}
    out = out.assign(_b=out["band"].map(band_rank), _c=out["condition"].map(cond_rank), _s=out["selector"] != "all",
                     _p=out["probe_point"].map(point_rank).fillna(len(point_rank)))
    out = out.sort_values(["_s", "selector", "_p", "probe_point", "source", "metric", "_c", "_b"], kind="mergesort")
    return out.drop(columns=["_b", "_c", "_s", "_p"]).reset_index(drop=True)


def annotate_band_deltas(ax, data: pd.DataFrame, num_layers: int, conditions: list[str], share: bool) -> None:
    """Write each condition's band delta vs original (pp for shares) inside the band, in the condition's colour."""
    bt = band_table(data, num_layers, [])
    others = [c for c in conditions if c != REFERENCE and c in set(bt["condition"])]
    for name, layers in bands(num_layers).items():
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


def layer_panel(ax, data: pd.DataFrame, conditions: list[str], num_layers: int, metric: str, title: str, empty: str,
                decorate=None, ylabel_size: float | None = None) -> None:
    """One per-layer panel of a probe readout (``data``: one metric at one probe point): a line per condition over
    the shaded layer bands, the band deltas vs original written in, or ``empty`` on a blank panel when ``data`` is.
    ``decorate(ax, per_layer)`` adds to the axes after the lines (limits, a zero line)."""
    if data.empty:
        plots.note_axis(ax, empty)
        return
    per_layer = data.groupby(["condition", "layer"])["value"].mean().reset_index()
    plots.layer_lines(ax, per_layer, conditions, num_layers)
    if decorate is not None:
        decorate(ax, per_layer)
    annotate_band_deltas(ax, data, num_layers, conditions, metric in SHARE_METRICS)
    ax.set_title(title, fontsize=8.5, pad=12)
    ax.set_ylabel(metric, **({} if ylabel_size is None else {"fontsize": ylabel_size}))


def _headroom(ax, per_layer: pd.DataFrame) -> None:
    """Room above the lines for the band deltas (from zero when every value is non-negative)."""
    top = float(per_layer["value"].max())
    ax.set_ylim(bottom=0 if per_layer["value"].min() >= 0 else None, top=top * 1.45 if top > 0 else 1)


@register("figure6", "figure", "Figure 6: evidence reading per layer and selector, with the compaction(alpha) curve",
          needs_probes)
def figure6(tables: dict) -> Figure:
    every = get_table(tables, "probes")
    num_layers = int(every["layer"].max()) + 1
    points = [(p, label) for p, label in PROBE_POINTS if (every["probe_point"] == p).any()]
    selectors = sorted(every["selector"].unique())  # each selector its own rows: never pooled
    rows = [(sel, p, label) for sel in selectors for p, label in points]
    fig = Figure(figsize=(13.0, 2.9 * len(rows) + 0.4), layout="constrained")
    axes = fig.subplots(len(rows), 4, squeeze=False)
    present = set(every["condition"])
    main_conditions = [c for c in FIGURE6_CONDITIONS if c in present] or [
        c for c in condition_order(present) if not c.startswith("compaction(")]
    for i, (selector, point, point_label) in enumerate(rows):
        probes = every[every["selector"] == selector]
        point_label = f"{point_label}, {selector}"
        for j, (source, metric, label) in enumerate(EVIDENCE_PANELS):
            data = probes[(probes["probe_point"] == point) & (probes["source"] == source) & (probes["metric"] == metric)
                          & probes["condition"].isin(main_conditions)]
            empty = f"no {label}\nat the {point_label}" + ("\n(phase replay is computed at the final\nquestion token "
                                                           "only)"
                                                          if source == "replay" else "")
            layer_panel(axes[i, j], data, main_conditions, num_layers, metric, f"{label}\n{point_label}", empty,
                        decorate=_headroom)
        _alpha_panel(axes[i, 3], probes, point, point_label, num_layers)
    plots.condition_legend(fig, axes, main_conditions)
    n = every["record_id"].nunique()
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
    data = data.assign(band=data["layer"].map(band_of(num_layers)))
    per_layer = data.groupby(["alpha", "band", "layer"])["value"].mean().reset_index()
    for band in ("early", "middle", "late"):
        b = per_layer[per_layer["band"] == band].groupby("alpha")["value"].mean()
        if len(b):
            ax.plot(b.index, b.values, marker="o", ms=3, lw=1.3, color=plots.BAND_SHADES[band], label=band)
    allb = per_layer.groupby("alpha")["value"].mean()
    ax.plot(allb.index, allb.values, marker="s", ms=3, lw=2, color="#222222", label="all layers")
    ax.set_xlabel("compaction alpha (0 = original, 1 = relay)")
    ax.set_ylabel(metric)
    ax.set_xticks(sorted(allb.index))
    ax.set_title(f"{'phase replay' if source == 'replay' else 'forward'}: gold share vs alpha\n{point_label}",
                 fontsize=8.5, pad=12)
    ax.legend(loc="best", fontsize=7)
