"""Table 1 (``analyses/main_table.py``): accuracy per selector x budget x condition, with the paired difference
vs ``original`` (contains and f1; 95% paired cluster-bootstrap intervals)."""

from __future__ import annotations

import pandas as pd

from relaylens.figures.registry import needs_scores, register
from relaylens.summaries import accuracy_table


@register("table1", "table", "Table 1: accuracy per selector and condition (contains, f1; 95% paired intervals)",
          needs_scores)
def table1(tables: dict) -> pd.DataFrame:
    return accuracy_table(tables)
