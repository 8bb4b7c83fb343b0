"""Gain vs history length (not in the paper): RoPERelay - Original, paired per record, for the run's accuracy metric
and for the evidence attention share of the final question token, across runs whose histories differ in length.

The paper argues that wider gaps between the kept states give compaction more room; with one run per history length
(``relaylens figures RUN_2K RUN_4K RUN_8K --out DIR``) this measures it. A run's history length is the median
``history_length`` of its answers (tokens). Each point is the paired difference with its 95% cluster-bootstrap
interval (:func:`relaylens.reporting.summaries.paired_deltas`); the table adds the win:loss counts (records where
relay beats original, and the reverse). The evidence share (``evidence_share_pp``, in percentage points) is the
forward readout at the final question token averaged over layers and query heads per record (records whose gold
evidence was dropped read 0 under both conditions; ``--retained-only`` leaves them out).

Example:
    >>> import pandas as pd
    >>> from relaylens.results.tables import example_tables
    >>> parts = []
    >>> for length, seed in ((2048, 0), (4096, 1)):
    ...     t = example_tables(records=6, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"),
    ...                        seed=seed)
    ...     parts.append({n: df.assign(model="m", dataset=f"d{length}",
    ...                                history_length=length) if n == "answers" else df.assign(model="m",
    ...                                dataset=f"d{length}") for n, df in t.items()})
    >>> tables = {n: pd.concat([p[n] for p in parts], ignore_index=True) for n in parts[0]}
    >>> table = history_length_table(tables)
    >>> table[table["quantity"] == "contains"]["history_tokens"].tolist(), sorted(table["quantity"].unique())
    ([2048, 4096], ['contains', 'evidence_share_pp', 'f1'])
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.registry import needs_relay_pairs, register
from relaylens.reporting.summaries import (
    EVIDENCE_PP,
    accuracy_scores,
    paired_deltas,
    quantity_list,
    record_evidence_share_pp,
    win_loss,
)
from relaylens.results.tables import get_table

TREATMENT = "relay"
REFERENCE = "original"


def _labels(frame: pd.DataFrame) -> list[str]:
    return [c for c in ("model", "dataset") if c in frame.columns]


def history_tokens(tables: dict) -> pd.DataFrame:
    """One row per run (``model``, ``dataset`` labels): the median ``history_length`` of its answers."""
    answers = get_table(tables, "answers")
    labels = _labels(answers)
    if not labels:
        return pd.DataFrame({"history_tokens": [int(answers["history_length"].median())]}) if len(answers) else \
            pd.DataFrame(columns=["history_tokens"])
    return (answers.groupby(labels, sort=True)["history_length"].median().round().astype(int)
            .rename("history_tokens").reset_index())


def needs_history_lengths(tables: dict) -> str | None:
    """Why the figure cannot be drawn: no original/relay pairs, or fewer than two history lengths."""
    reason = needs_relay_pairs(tables)
    if reason:
        return reason
    lengths = history_tokens(tables)
    if lengths["history_tokens"].nunique() < 2:
        return ("a single history length (one run per length makes the curve: `relaylens figures RUN_2K RUN_4K "
                "--out DIR`)")
    return None


def _record_rows(tables: dict) -> pd.DataFrame:
    """Long per-record rows of the compared quantities: the accuracy metric(s) and ``evidence_share_pp``
    (percentage points)."""
    scores = accuracy_scores(tables)
    labels = _labels(scores)
    key = labels + ["record_id", "selector", "budget", "condition", "cluster_id"]
    evidence = record_evidence_share_pp(tables, labels)
    parts = [scores[key + ["metric", "value"]]] + ([evidence] if len(evidence) else [])
    return pd.concat(parts, ignore_index=True)


def history_length_table(tables: dict) -> pd.DataFrame:
    """One row per (run, selector, budget, quantity): ``history_tokens``, the relay - original paired difference
    ``delta`` with its interval, the number of pairs ``n`` and the win:loss counts ``wins`` / ``losses``."""
    rows = _record_rows(tables)
    labels = _labels(rows)
    by = labels + ["selector", "budget"]
    rows = rows[rows["condition"].isin([REFERENCE, TREATMENT])]
    quantities = quantity_list(rows)
    deltas = paired_deltas(rows, by=by, reference=REFERENCE, metrics=quantities)
    deltas = deltas[deltas["condition"] == TREATMENT]
    counts = win_loss(rows, by, reference=REFERENCE)
    counts = counts[counts["condition"] == TREATMENT].drop(columns="condition")
    out = (deltas.rename(columns={"mean": "delta", "low": "delta_low", "high": "delta_high"})
           [by + ["metric", "delta", "delta_low", "delta_high"]]
           .merge(counts, on=by + ["metric"], how="left").rename(columns={"metric": "quantity"}))
    lengths = history_tokens(tables)
    out = out.merge(lengths, on=labels, how="left") if labels else out.assign(
        history_tokens=int(lengths["history_tokens"].iloc[0]))
    rank = {q: i for i, q in enumerate(quantities)}
    out = out.assign(_q=out["quantity"].map(rank)).sort_values(
        [c for c in ("model",) if c in out.columns] + ["selector", "budget", "_q", "history_tokens"])
    columns = [c for c in ("model",) if c in out.columns] + ["history_tokens"] + [c for c in ("dataset",)
                                                                                  if c in out.columns]
    columns += ["selector", "budget", "quantity", "delta", "delta_low", "delta_high", "n", "wins", "losses"]
    return out[columns].reset_index(drop=True).astype({"n": int, "wins": int, "losses": int})


@register("history_length_table", "table", "Gain vs history length: relay - original per run (paired, 95% cluster "
          "bootstrap), win:loss counts", needs_history_lengths)
def history_length_numbers(tables: dict) -> pd.DataFrame:
    return history_length_table(tables)


@register("history_length", "figure", "Gain vs history length: relay - original accuracy and evidence share, "
          "with 95% intervals", needs_history_lengths)
def history_length(tables: dict) -> Figure:
    table = history_length_table(tables)
    quantities = list(dict.fromkeys(table["quantity"]))
    fig = Figure(figsize=(3.2 * len(quantities) + 0.4, 2.9), layout="constrained")
    axes = fig.subplots(1, len(quantities), squeeze=False)[0]
    series = [c for c in ("model", "selector", "budget") if c in table.columns]
    groups = list(table.groupby(series, sort=True))
    palette = seaborn.color_palette("colorblind", max(1, len(groups))).as_hex()
    for ax, quantity in zip(axes, quantities):
        sub = table[table["quantity"] == quantity]
        for k, (key, g) in enumerate(groups):
            g = sub.merge(g[series].drop_duplicates(), on=series).sort_values("history_tokens")
            if g.empty:
                continue
            x = g["history_tokens"].to_numpy(dtype=np.float64) * (1.0 + 0.03 * (k - (len(groups) - 1) / 2))
            y = g["delta"].to_numpy(dtype=np.float64)
            err = np.vstack([y - g["delta_low"].to_numpy(dtype=np.float64),
                             g["delta_high"].to_numpy(dtype=np.float64) - y])
            label = " ".join(str(v) for v in (key if isinstance(key, tuple) else (key,)))
            ax.errorbar(x, y, yerr=err, marker="o", ms=3.5, lw=1.4, capsize=2.5, label=label,
                        color=palette[k % len(palette)])
        ax.axhline(0.0, color="#888888", lw=0.8, zorder=0)
        ax.set_xscale("log", base=2)
        ticks = sorted(sub["history_tokens"].unique())
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("history tokens (median)")
        title = "evidence share, pp (final question token)" if quantity == EVIDENCE_PP else plots.metric_label(quantity)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("relay - original")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=max(1, min(len(labels), 4)), fontsize=7)
    fig.supxlabel("paired per record; bars: 95% cluster-bootstrap interval", fontsize=7, color="#555555")
    return fig
