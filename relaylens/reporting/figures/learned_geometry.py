"""Figure ``learned_geometry`` and table ``learned_table`` (``relaylens/analyses/learned_geometry.py``): what geometry
the model wanted, and whether it beats RoPERelay on held-out records.

Figure, top row: the learned ``b``, ``s`` and ``alpha`` per layer (one point per kv head where they are per head, a
line through the layer means) beside RoPERelay's values (``b = s = alpha = 1``, dashed); bottom row: the train /
test log-likelihood curve (per-token mean of the teacher-forced reference answer; train: each step's records at the
parameters before its update, and every train / test record at the evaluation steps; step 0 is RoPERelay), the test
records' answer log-likelihood under the learned map against relay (one point per record; above the diagonal: the
learned map is better), and the paired differences learned - relay and learned - original with 95% cluster-bootstrap
intervals. The table holds those numbers per metric (``answer_loglik``, ``contains``, ``f1``, evidence share in pp,
``mean_key_distance``: the mean distance from the question to the kept keys, in positions).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relaylens.reporting import plots
from relaylens.reporting.figures.layer_scope import per_record_evidence
from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import paired_deltas
from relaylens.results.tables import ANSWER_LOGLIK, get_table

LEARNED = "learned"
RELAY_VALUES = {"b": 1.0, "s": 1.0, "alpha": 1.0}
TABLE_METRICS = (ANSWER_LOGLIK, "contains", "f1", "evidence_share", "mean_key_distance")
CURVE_COLORS = {"train_loglik": "#9ecae1", "test_loglik": "#e6550d", "train_all_loglik": "#3182bd"}


def needs_geometry(tables: dict) -> str | None:
    """Why the learned-geometry entries cannot be drawn (no geometry table), or None."""
    geometry = get_table(tables, "geometry")
    if not len(geometry) or not (geometry["metric"] == "b").any():
        return "no geometry table (relaylens run learned_geometry writes it)"
    return None


def final_parameters(geometry: pd.DataFrame) -> pd.DataFrame:
    """The parameters after the last step: columns ``layer, head, metric, value`` (``-1`` where shared)."""
    params = geometry[geometry["metric"].isin(list(RELAY_VALUES))]
    last = int(params["step"].max())
    return params[params["step"] == last][["layer", "head", "metric", "value"]].reset_index(drop=True)


def curves(geometry: pd.DataFrame) -> pd.DataFrame:
    """``step, metric, value`` of ``train_loglik``, ``train_all_loglik`` and ``test_loglik``."""
    rows = geometry[geometry["metric"].isin(["train_loglik", "train_all_loglik", "test_loglik"])]
    return rows[["step", "metric", "value"]].sort_values(["metric", "step"]).reset_index(drop=True)


def _condition_scores(tables: dict) -> pd.DataFrame:
    """Per-record scores of the table's metrics (evidence share in pp from the probes) in the long score format."""
    scores = get_table(tables, "scores")
    frames = [scores[scores["metric"].isin(TABLE_METRICS)]]
    evidence = per_record_evidence(tables)
    if len(evidence):
        frames.append(evidence)
    return pd.concat(frames, ignore_index=True)


def learned_deltas(tables: dict) -> pd.DataFrame:
    """Paired differences learned - relay and learned - original per metric: ``comparison, metric, mean, low, high,
    n``."""
    scores = _condition_scores(tables)
    out = []
    for reference in ("relay", "original"):
        deltas = paired_deltas(scores, [], reference=reference, metrics=TABLE_METRICS)
        deltas = deltas[deltas["condition"] == LEARNED]
        out.append(deltas.assign(comparison=f"learned - {reference}"))
    frame = pd.concat(out, ignore_index=True)
    return frame[["comparison", "metric", "mean", "low", "high", "n"]]


@register("learned_table", "table", "Learned geometry vs relay and original on the test records (paired, 95% CI)",
          needs_geometry)
def learned_table(tables: dict) -> pd.DataFrame:
    scores = _condition_scores(tables)
    deltas = learned_deltas(tables)
    rows = []
    for metric in TABLE_METRICS:
        sub = scores[scores["metric"] == metric]
        if sub.empty:
            continue
        means = sub.groupby("condition")["value"].mean()
        row = {"metric": metric, **{c: float(means.get(c, np.nan)) for c in ("original", "relay", LEARNED)}}
        for comparison in ("learned - relay", "learned - original"):
            d = deltas[(deltas["comparison"] == comparison) & (deltas["metric"] == metric)]
            tag = comparison.split(" - ")[1]
            row |= {f"vs_{tag}": float(d["mean"].iloc[0]) if len(d) else np.nan,
                    f"vs_{tag}_low": float(d["low"].iloc[0]) if len(d) else np.nan,
                    f"vs_{tag}_high": float(d["high"].iloc[0]) if len(d) else np.nan}
        row["n"] = int(sub["record_id"].nunique())
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["note"] = ("answer_loglik: mean per-token log-likelihood of the teacher-forced reference answer; "
                           "evidence_share in pp (mean over layers and heads); mean_key_distance in positions")
    return table


def _parameter_panel(ax, params: pd.DataFrame, name: str, num_layers: int) -> None:
    sub = params[params["metric"] == name]
    if (sub["layer"] < 0).all():  # global: one value for every layer
        ax.plot([0, num_layers - 1], [sub["value"].iloc[0]] * 2, color=plots.condition_color(LEARNED), lw=1.6,
                label="learned (global)")
    else:
        per_head = sub[sub["head"] >= 0]
        if len(per_head):
            ax.scatter(per_head["layer"], per_head["value"], s=9, color=plots.condition_color(LEARNED), alpha=0.45,
                       label="learned, per kv head")
        means = sub.groupby("layer")["value"].mean()
        ax.plot(means.index, means.values, marker="o", ms=3, lw=1.3, color=plots.condition_color(LEARNED),
                label="learned (layer mean)")
    ax.axhline(RELAY_VALUES[name], color=plots.condition_color("relay"), ls="--", lw=1.0, label="relay")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title({"b": "b: distance from the last kept key", "s": "s: gap scale", "alpha": "alpha: unit-gap mix"}[name])
    if name == "b":
        ax.set_yscale("log")
    ax.legend(loc="best", fontsize=7)


def _curve_panel(ax, curve: pd.DataFrame) -> None:
    for metric, label in (("train_loglik", "train, the step's records"), ("train_all_loglik", "train, all records"),
                          ("test_loglik", "test, all records")):
        sub = curve[curve["metric"] == metric]
        if len(sub):
            batch = metric == "train_loglik"
            ax.plot(sub["step"], sub["value"], marker=None if batch else "o", ms=4, lw=0.8 if batch else 1.5,
                    color=CURVE_COLORS[metric], label=label)
    ax.set_xlabel("step (0: relay)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("answer log-likelihood per token")
    ax.set_title("train / test log-likelihood")
    ax.legend(loc="best", fontsize=7)


def _scatter_panel(ax, scores: pd.DataFrame) -> None:
    sub = scores[scores["metric"] == ANSWER_LOGLIK]
    wide = sub.pivot_table(index="record_id", columns="condition", values="value", aggfunc="first")
    if not {"relay", LEARNED} <= set(wide.columns):
        plots.note_axis(ax, "no answer_loglik scores of relay and learned")
        return
    x, y = wide["relay"].to_numpy(), wide[LEARNED].to_numpy()
    ax.scatter(x, y, s=14, color=plots.condition_color(LEARNED), zorder=3)
    finite = np.concatenate([x[np.isfinite(x)], y[np.isfinite(y)]])
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    ax.plot([low, high], [low, high], color="#999999", lw=0.8, zorder=1)
    ax.set_xlabel("relay: answer log-likelihood")
    ax.set_ylabel("learned: answer log-likelihood")
    ax.set_title(f"test records ({int(np.isfinite(x - y).sum())}): learned vs relay")


def _delta_panel(ax, deltas: pd.DataFrame) -> None:
    shown = deltas[deltas["metric"].isin([ANSWER_LOGLIK, "contains", "f1"])]
    if shown.empty:
        plots.note_axis(ax, "no paired test scores")
        return
    labels = []
    for i, (_, r) in enumerate(shown.iterrows()):
        color = plots.condition_color("relay" if r["comparison"].endswith("relay") else "original")
        ax.errorbar(i, r["mean"], yerr=[[max(r["mean"] - r["low"], 0)], [max(r["high"] - r["mean"], 0)]], fmt="o", ms=5,
                    color=color, ecolor="#333333", elinewidth=1, capsize=2)
        labels.append(f"{r['metric']}\n{r['comparison']}")
    ax.axhline(0, color="#999999", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=6)
    ax.set_title("paired differences (95% CI)")


@register("learned_geometry", "figure", "Learned geometry: parameters per layer, learning curves, learned vs relay",
          needs_geometry)
def learned_geometry(tables: dict) -> Figure:
    geometry = get_table(tables, "geometry")
    params = final_parameters(geometry)
    probes = get_table(tables, "probes")
    layers = [int(params["layer"].max()) + 1, int(probes["layer"].max()) + 1 if len(probes) else 1]
    num_layers = max(layers)
    fig = Figure(figsize=(12.0, 7.0), layout="constrained")
    axes = fig.subplots(2, 3)
    for ax, name in zip(axes[0], ("b", "s", "alpha")):
        _parameter_panel(ax, params, name, num_layers)
    _curve_panel(axes[1, 0], curves(geometry))
    _scatter_panel(axes[1, 1], _condition_scores(tables))
    _delta_panel(axes[1, 2], learned_deltas(tables))
    steps = int(geometry["step"].max())
    n = get_table(tables, "answers")["record_id"].nunique()
    fig.supxlabel(f"{steps} steps; test records: {n}; intervals: 95% paired cluster bootstrap", fontsize=7,
                  color="#555555")
    return fig
