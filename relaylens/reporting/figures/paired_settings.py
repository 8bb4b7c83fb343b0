"""Table 8, the paper's (``relaylens/analyses/main_table.py`` grid): per setting (model, dataset, selector, budget) the
paired RoPERelay - Original difference of the run's metric with its 95% cluster-bootstrap interval (10,000 resamples),
the two means over the same valid pairs (they reconcile with the difference when a judge failed on some rows), and how
many settings improve ("N of M settings improve", over the settings with a valid pair). A setting with fewer than 10
clusters is flagged (``flag``; its interval takes few distinct values). Several run directories (``relaylens figures
RUN...``) make the model x dataset grid.

``relay_gain`` draws the same numbers: one row per setting (a press of a ``kvpress:`` sweep, a selector, a budget),
sorted by the difference, with its interval and both means, one panel per metric."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.crossrun import paired_settings_table, settings_count
from relaylens.reporting.figures.registry import needs_relay_pairs, register
from relaylens.reporting.summaries import accuracy_scores, budget_label, metric_list


@register("table8", "table", "Table 8: paired RoPERelay - Original difference per setting (95% cluster bootstrap, "
          "10,000 resamples)", needs_relay_pairs)
def table8(tables: dict) -> pd.DataFrame:
    scores = accuracy_scores(tables)
    parts = [paired_settings_table(scores, metric) for metric in metric_list(scores)]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    out.attrs["note"] = "; ".join(f"{m}: {settings_count(out[out['metric'] == m])}" for m in out["metric"].unique())
    return out


def table8_lines(scores: pd.DataFrame, metrics) -> list[tuple[str, str]]:
    """``("Table 8 (metric)", "N of M settings improve (...): setting delta [low, high], ...")`` per metric: the
    report's summary of Table 8 (settings named ``model x dataset: selector @ budget`` in a cross-run grid)."""
    if not {"original", "relay"} <= set(scores["condition"]):
        return []
    lines = []
    for metric in metrics:
        t8 = paired_settings_table(scores, metric)
        if len(t8):
            deltas = ", ".join(f"{_setting(r)} {r.delta:+.3f} [{r.delta_low:+.3f}, {r.delta_high:+.3f}]"
                               + (f" - {r.flag}" if r.flag else "") for r in t8.itertuples())
            lines.append((f"Table 8 ({metric})", f"{settings_count(t8)}: {deltas}"))
    return lines


def _setting(row) -> str:
    grid = " x ".join(str(getattr(row, c)) for c in ("model", "dataset") if hasattr(row, c))
    return (f"{grid}: " if grid else "") + f"{row.selector} @ {budget_label(float(row.budget))}"


@register("relay_gain", "figure", "RoPERelay gain per setting: paired relay - original with 95% intervals, sorted",
          needs_relay_pairs)
def relay_gain(tables: dict) -> Figure:
    scores = accuracy_scores(tables)
    parts = {m: paired_settings_table(scores, m) for m in metric_list(scores)}
    parts = {m: t for m, t in parts.items() if len(t)}
    metrics = list(parts)
    rows = max(len(t) for t in parts.values())
    fig = Figure(figsize=(4.2 * len(metrics) + 1.6, 0.9 + 0.28 * rows), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        table = parts[metric].assign(label=lambda t: [_setting(r) for r in t.itertuples()])
        table = table.sort_values(["delta", "label"], ascending=[True, False]).reset_index(drop=True)
        y = np.arange(len(table), dtype=np.float64)
        delta = table["delta"].to_numpy(dtype=np.float64)
        err = np.vstack([delta - table["delta_low"].to_numpy(dtype=np.float64),
                         table["delta_high"].to_numpy(dtype=np.float64) - delta])
        ax.errorbar(delta, y, xerr=np.clip(err, 0, None), fmt="o", ms=3.5, capsize=2.5, lw=1.2,
                    color=plots.condition_color("relay"), zorder=3)
        ax.axvline(0.0, color="#888888", lw=0.8, zorder=0)
        ax.set_yticks(y, [f"{r.label}  ({r.original:.2f} -> {r.relay:.2f})" for r in table.itertuples()], fontsize=7)
        ax.set_ylim(-0.7, len(table) - 0.3)
        ax.set_xlabel(f"relay - original, {plots.metric_label(metric)}")
        ax.set_title(f"{plots.metric_label(metric)}: {settings_count(table)}", fontsize=8)
    fig.supxlabel("paired per record (means in brackets: original -> relay); bars: 95% cluster-bootstrap interval",
                  fontsize=7, color="#555555")
    return fig
