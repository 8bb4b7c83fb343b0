"""Table 6 (``relaylens/analyses/question_types.py``, also ``full_kv``): accuracy per question type."""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.figures.registry import needs_scores, register
from relaylens.reporting.summaries import accuracy_table


@register("table6", "table", "Table 6: accuracy per question type", needs_scores)
def table6(tables: dict) -> pd.DataFrame:
    return accuracy_table(tables, by=("selector", "budget", "question_type"))
