"""Answering at all vs answering right, per condition: the empty-answer rate, the probability the model gives an
end of answer (EOS / end-of-turn) as its first token, the accuracy, the accuracy over the answers that are not
empty, and the rate at which the decoding limit cut an answer (``hit_limit_rate``: an answer cut there may hold
the right words after the cut), each with its 95% cluster-bootstrap interval and its paired difference against
``original``.

A gain in accuracy can come from format (the model answers at all instead of ending its turn at once) or from content
(the answers it gives are right more often); this table separates the two. ``first_token_eos_prob`` is recorded by
runs of this relaylens (an ``answers`` column); older runs show it empty.

Example:
    >>> from relaylens.results.tables import example_tables
    >>> t = example_tables(records=6, selectors=("bm25",), budgets=(0.1,), conditions=("original", "relay"))
    >>> table = answering_table(t)
    >>> table[["condition", "n", "empty_rate"]].to_dict("list")["condition"]
    ['original', 'relay']
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relaylens.reporting.figures.registry import needs_scores, register
from relaylens.reporting.summaries import (
    REFERENCE,
    accuracy_means,
    accuracy_scores,
    condition_order,
    metric_list,
    paired_deltas,
)
from relaylens.results.tables import get_table

DERIVED = ("empty_rate", "first_token_eos_prob", "accuracy", "accuracy_nonempty", "hit_limit_rate")
"""The table's quantities, in column order."""


def answering_rows(tables: dict) -> pd.DataFrame:
    """Long rows (``record_id, selector, budget, condition, cluster_id, metric, value``) of the derived quantities;
    ``accuracy`` is the run's metric (the first of ``tables["metrics"]``), ``accuracy_nonempty`` the same where the
    answer is not empty (NaN otherwise, so that means and pairs leave those rows out)."""
    answers = get_table(tables, "answers")
    labels = [c for c in ("model", "dataset") if c in answers.columns]
    key = labels + ["record_id", "selector", "budget", "condition"]
    scores = accuracy_scores(tables)
    metric = (tables.get("metrics") or metric_list(scores) or [None])[0]
    acc = scores[scores["metric"] == metric][key + ["value"]].rename(columns={"value": "accuracy"})
    base = answers[key + ["cluster_id", "answer", "first_token_eos_prob", "hit_limit"]].copy()
    base["empty_rate"] = (base["answer"].fillna("").str.strip() == "").astype(np.float64)
    base["hit_limit_rate"] = base["hit_limit"].astype(np.float64)  # the decoding limit cut the answer
    base = base.merge(acc, on=key, how="left")
    base["accuracy_nonempty"] = base["accuracy"].where(base["empty_rate"] == 0.0)
    long = base.melt(id_vars=key + ["cluster_id"], value_vars=list(DERIVED), var_name="metric", value_name="value")
    return long.astype({"value": np.float64})


def answering_table(tables: dict) -> pd.DataFrame:
    """One row per (setting, condition): ``n`` answers and, per quantity of :data:`DERIVED`, its mean with interval
    (``x``, ``x_low``, ``x_high``) and, off ``original``, the paired difference (``x_delta`` with interval)."""
    rows = answering_rows(tables)
    labels = [c for c in ("model", "dataset") if c in rows.columns]
    by = labels + ["selector", "budget"]
    means = accuracy_means(rows, by=by + ["condition"], metrics=list(DERIVED))
    deltas = paired_deltas(rows, by=by, reference=REFERENCE, metrics=list(DERIVED))
    out = []
    counts = rows[rows["metric"] == "empty_rate"].groupby(by + ["condition"], sort=True).size()
    for group, g in means.groupby(by, sort=True):
        group = group if isinstance(group, tuple) else (group,)
        for condition in condition_order(g["condition"].unique()):
            row = dict(zip(by, group)) | {"condition": condition, "n": int(counts.get(group + (condition,), 0))}
            for metric in DERIVED:
                m = g[(g["condition"] == condition) & (g["metric"] == metric)]
                row |= {metric: m["mean"].iloc[0] if len(m) else np.nan,
                        f"{metric}_low": m["low"].iloc[0] if len(m) else np.nan,
                        f"{metric}_high": m["high"].iloc[0] if len(m) else np.nan}
            for metric in ("empty_rate", "accuracy", "accuracy_nonempty"):
                d = deltas[(deltas["condition"] == condition) & (deltas["metric"] == metric)]
                for col in by:
                    d = d[d[col] == row[col]]
                row |= {f"{metric}_delta": d["mean"].iloc[0] if len(d) else np.nan,
                        f"{metric}_delta_low": d["low"].iloc[0] if len(d) else np.nan,
                        f"{metric}_delta_high": d["high"].iloc[0] if len(d) else np.nan}
            out.append(row)
    return pd.DataFrame(out)


def needs_answering(tables: dict) -> str | None:
    """Why the table cannot be built: no accuracy rows, or no first-token EOS probabilities (runs before them)."""
    reason = needs_scores(tables)
    if reason:
        return reason
    answers = get_table(tables, "answers")
    if "first_token_eos_prob" not in answers.columns or not answers["first_token_eos_prob"].notna().any():
        return ("the answers table has no first_token_eos_prob (a run of an older relaylens). Fix: run the analysis "
                "again with this relaylens (it resumes nothing: a new run directory)")
    return None


@register("answering", "table", "Answering at all vs answering right: empty answers, first-token end-of-answer "
          "probability, accuracy, accuracy over non-empty answers and answers cut by the decoding limit (95% "
          "intervals; differences vs original)",
          needs_answering)
def answering(tables: dict) -> pd.DataFrame:
    return answering_table(tables)
