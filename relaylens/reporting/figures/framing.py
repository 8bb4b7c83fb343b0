"""Which part of the framing matters (``relaylens/analyses/framing.py``, beyond the paper): per framing cell (what is
kept on top of the same source budget: nothing, the first 1 / 4 tokens, the instruction, the chat template's head, the
session headers, all the framing, the framing and the headers) and condition, the accuracy, the empty-answer rate, the
first-token end-of-answer probability and the rate at which answers hit the decoding limit; each with its 95%
cluster-bootstrap interval, the paired difference against ``original`` in the same cell, and the paired difference
against the ``none`` cell (the framing evicted) under the same condition.

The units of a framing run are labelled ``SELECTOR@keep=CELL``
(:meth:`relaylens.experiments.specs.ExperimentSpec.unit_selectors`).

Example:
    >>> from relaylens.results.tables import example_tables
    >>> t = example_tables(records=6, selectors=("bm25@keep=none", "bm25@keep=framing"), budgets=(0.1,),
    ...                    conditions=("original", "relay"))
    >>> table = framing_table(t)
    >>> table[["cell", "condition"]].values.tolist()
    [['none', 'original'], ['none', 'relay'], ['framing', 'original'], ['framing', 'relay']]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from relaylens.reporting import plots
from relaylens.reporting.figures.answering import answering_rows, needs_answering
from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import REFERENCE, accuracy_means, condition_order, paired_deltas
from relaylens.results.tables import KEEP_MARK, get_table

CELLS = ("none", "sink1", "sink4", "instruction", "template", "headers", "framing", "all")
QUANTITIES = ("accuracy", "empty_rate", "first_token_eos_prob", "hit_limit")
EVICTED = "none"


def needs_framing(tables: dict) -> str | None:
    answers = get_table(tables, "answers")
    if not len(answers) or not answers["selector"].astype(str).str.contains(KEEP_MARK, regex=False).any():
        return "no framing cells in the run (units labelled SELECTOR@keep=CELL: relaylens run framing)"
    return needs_answering(tables)


def _rows(tables: dict) -> pd.DataFrame:
    """Long per-record rows of :data:`QUANTITIES` (the answering table's, ``hit_limit_rate`` named ``hit_limit``)
    with ``base`` (the selector) and ``cell`` split from the unit label."""
    rows = answering_rows(tables).replace({"metric": {"hit_limit_rate": "hit_limit"}})
    rows = rows[rows["metric"].isin(QUANTITIES)]
    parts = rows["selector"].astype(str).str.partition(KEEP_MARK)
    return rows.assign(base=parts[0], cell=parts[2].where(parts[1] != "", "(unlabelled)"))


def _cell_order(cells) -> list[str]:
    known = [c for c in CELLS if c in set(cells)]
    return known + sorted(set(cells) - set(known))


def framing_table(tables: dict) -> pd.DataFrame:
    """One row per (selector, budget, cell, condition): ``n``; per quantity its mean with interval, the paired
    difference vs ``original`` in the cell (``_vs_original``) and vs the ``none`` cell under the same condition
    (``_vs_none``), each with its interval."""
    rows = _rows(tables)
    by = ["base", "budget", "cell"]
    means = accuracy_means(rows, by=by + ["condition"], metrics=list(QUANTITIES))
    within = paired_deltas(rows, by=by, reference=REFERENCE, metrics=list(QUANTITIES))
    # across cells: the cell plays the condition, paired by record within (selector, budget, condition)
    swapped = rows.assign(selector=rows["base"] + "|" + rows["condition"], condition=rows["cell"])
    across = paired_deltas(swapped, by=["base", "budget", "selector"], reference=EVICTED, metrics=list(QUANTITIES)) \
        if EVICTED in set(rows["cell"]) else pd.DataFrame(columns=["base", "budget", "selector", "condition", "metric"])
    out = []
    counts = rows[rows["metric"] == "accuracy"].groupby(by + ["condition"]).size()
    for (base, budget), g in means.groupby(["base", "budget"], sort=True):
        for cell in _cell_order(g["cell"].unique()):
            for condition in condition_order(g[g["cell"] == cell]["condition"].unique()):
                row = {"selector": base, "budget": budget, "cell": cell, "condition": condition,
                       "n": int(counts.get((base, budget, cell, condition), 0))}
                for q in QUANTITIES:
                    m = g[(g["cell"] == cell) & (g["condition"] == condition) & (g["metric"] == q)]
                    row |= _triple(q, m)
                    d = within[(within["base"] == base) & (within["budget"] == budget) & (within["cell"] == cell)
                               & (within["condition"] == condition) & (within["metric"] == q)]
                    row |= _triple(f"{q}_vs_original", d)
                    d = across[(across["base"] == base) & (across["budget"] == budget) & (across["condition"] == cell)
                               & (across["metric"] == q) & (across["selector"] == f"{base}|{condition}")]
                    row |= _triple(f"{q}_vs_none", d)
                out.append(row)
    return pd.DataFrame(out)


def _triple(name: str, frame: pd.DataFrame) -> dict:
    one = len(frame) == 1
    return {name: frame["mean"].iloc[0] if one else np.nan, f"{name}_low": frame["low"].iloc[0] if one else np.nan,
            f"{name}_high": frame["high"].iloc[0] if one else np.nan}


@register("framing_table", "table", "Which part of the framing matters: accuracy, empty answers, first-token "
          "end-of-answer probability and hit-limit rate per framing cell and condition, paired differences vs "
          "original and vs the framing evicted (95% intervals)", needs_framing)
def framing_numbers(tables: dict) -> pd.DataFrame:
    return framing_table(tables)


@register("framing", "figure", "Which part of the framing matters: accuracy, empty answers and first-token "
          "end-of-answer probability per framing cell, original vs relay", needs_framing)
def framing_figure(tables: dict) -> Figure:
    table = framing_table(tables)
    settings = table[["selector", "budget"]].drop_duplicates().values.tolist()
    shown = ("accuracy", "empty_rate", "first_token_eos_prob")
    fig = Figure(figsize=(4.2 * len(shown), 3.2 * len(settings)), layout="constrained")
    axes = fig.subplots(len(settings), len(shown), squeeze=False)
    for r, (selector, budget) in enumerate(settings):
        part = table[(table["selector"] == selector) & (table["budget"] == budget)]
        cells = _cell_order(part["cell"].unique())
        conditions = condition_order(part["condition"].unique())
        width = 0.8 / max(len(conditions), 1)
        for ax, q in zip(axes[r], shown):
            for k, condition in enumerate(conditions):
                c = part[part["condition"] == condition].set_index("cell").reindex(cells)
                x = np.arange(len(cells)) + (k - (len(conditions) - 1) / 2) * width
                err = np.vstack([c[q] - c[f"{q}_low"], c[f"{q}_high"] - c[q]]).clip(min=0)
                ax.bar(x, c[q], width, yerr=err, color=plots.condition_color(condition), label=condition,
                       error_kw={"elinewidth": 0.8, "capsize": 2})
            ax.set_xticks(np.arange(len(cells)), cells, rotation=30, ha="right")
            label = plots.metric_label(q) if q == 'accuracy' else q.replace('_', ' ')
            ax.set_title(f"{label}: {selector} @ {budget:g}", fontsize=9)
            ax.set_ylim(0, 1.05)
        axes[r][0].legend(fontsize=7, loc="upper left")
    fig.supxlabel("kept on top of the same source budget; error bars: 95% cluster bootstrap", fontsize=7,
                  color="#555555")
    return fig
