"""Table 2 (``relaylens/analyses/infinitebench.py``): per InfiniteBench task, its official metric under original and
RoPERelay coordinates, with the paired difference.

Built from the run's tables only. Rows: one per (task, selector, budget); columns: the task's metric, ``n`` paired
records, ``original`` / ``relay`` means with 95% cluster-bootstrap intervals (``_low`` / ``_high``) over those same
valid pairs (so ``delta = relay - original`` of the printed means even when some rows failed), ``delta`` paired
by record with its interval, ``skipped`` (records of the task the length filter skipped, when the run has a
``skipped`` table) and ``flag`` (fewer than 10 clusters, or no valid pair: the intervals are unreliable).
"""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.bootstrap import PAIR_COLUMNS, condition_means, few_clusters, paired_difference, paired_values
from relaylens.reporting.figures.registry import register
from relaylens.results.tables import get_table

TASK_METRICS = {"longdialogue_qa_eng": "contains", "longbook_choice_eng": "choice_accuracy", "longbook_qa_eng": "f1"}
"""InfiniteBench's official metric per task, as named in the scores table
(:func:`relaylens.scoring.metrics.score_answer`): En.Dia counts an answer right when the label is one of its words
(``contains`` for this task), En.MC is choice accuracy, En.QA the SQuAD token F1 without number normalisation."""
TASK_LABELS = {"longdialogue_qa_eng": "En.Dia", "longbook_choice_eng": "En.MC", "longbook_qa_eng": "En.QA"}
COLUMNS = ["task", "label", "metric", "selector", "budget", "n", "original", "original_low", "original_high", "relay",
           "relay_low", "relay_high", "delta", "delta_low", "delta_high", "skipped", "flag"]


def _skipped(tables: dict, task: str) -> int:
    skipped = tables.get("skipped")  # the record-skipping table (length filter), when the run has one
    if skipped is None or skipped.empty or "record_id" not in skipped:
        return 0
    return int(skipped.loc[skipped["record_id"].astype(str).str.startswith(task + "_"), "record_id"].nunique())


def needs_infinitebench(tables: dict) -> str | None:
    """Why Table 2 cannot be built (no InfiniteBench task scored under original and relay), or None."""
    scores = get_table(tables, "scores")
    tasks = scores[scores["question_type"].isin(list(TASK_METRICS))]
    if not len(tasks):
        return "no InfiniteBench records (question_type longdialogue_qa_eng / longbook_choice_eng / longbook_qa_eng)"
    return None if {"original", "relay"} <= set(tasks["condition"]) else "InfiniteBench rows need original and relay"


@register("table2", "table",
          "Table 2: InfiniteBench per task, official metric, original vs relay (95% paired intervals)",
          needs_infinitebench)
def table2(tables: dict, reference: str = "original", condition: str = "relay") -> pd.DataFrame:
    """Table 2 from ``tables``: one row per (task, selector, budget); see the module docstring for the columns."""
    scores = get_table(tables, "scores")
    rows = []
    for task, metric in TASK_METRICS.items():
        df = scores[(scores["question_type"] == task) & (scores["metric"] == metric)]
        for (selector, budget), g in df.groupby(["selector", "budget"], sort=True):
            if not {reference, condition} <= set(g["condition"]):
                continue
            diff = paired_difference(g, metric, a=condition, b=reference)
            pairs, _ = paired_values(g, metric, condition, reference)  # the means over the pairs the delta uses
            valid = g.merge(pairs[PAIR_COLUMNS], on=PAIR_COLUMNS, how="inner")
            means = condition_means(valid, metric, by=("condition",)).set_index("condition")
            means = means.reindex([reference, condition])  # no valid pair: NaN means
            row = {"task": task, "label": TASK_LABELS[task], "metric": metric, "selector": selector,
                   "budget": budget, "n": diff.n, "skipped": _skipped(tables, task),
                   "flag": few_clusters(diff.n_clusters, diff.n)}
            for name in (reference, condition):
                row |= {name: means.at[name, "mean"], f"{name}_low": means.at[name, "low"],
                        f"{name}_high": means.at[name, "high"]}
            row |= {"delta": diff.mean, "delta_low": diff.low, "delta_high": diff.high}
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
