"""Table 1 (``relaylens/analyses/main_table.py``): accuracy per selector x budget x condition, with the paired
difference vs ``original`` (the run's metric: judge or choice accuracy where present, else contains and f1; 95% paired
cluster-bootstrap intervals). Several runs: one row block per model x dataset."""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.figures.registry import needs_scores, register
from relaylens.reporting.summaries import accuracy_table
from relaylens.results.tables import get_table


@register("table1", "table", "Table 1: accuracy per selector and condition (the run's metric; 95% paired intervals)",
          needs_scores)
def table1(tables: dict) -> pd.DataFrame:
    scores = get_table(tables, "scores")
    labels = [c for c in ("model", "dataset") if c in scores.columns]  # several runs: the model x dataset grid
    return accuracy_table(tables, by=(*labels, "selector", "budget"))
