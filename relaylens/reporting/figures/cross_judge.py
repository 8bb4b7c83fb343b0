"""The cross-judge table (the paper's Table 12; ``relaylens judge RUN_DIR`` adds a judge): per selector and budget,
the RoPERelay gain under each judge, the judges' raw agreement and Cohen's kappa over the same answers."""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.figures.registry import register
from relaylens.results.tables import get_table
from relaylens.scoring.agreement import cross_judge_table, judge_metrics


def needs_two_judges(tables: dict) -> str | None:
    scores = get_table(tables, "scores")
    return None if len(judge_metrics(scores)) >= 2 else "fewer than two judges scored the run (`relaylens judge`)"


@register("cross_judge", "table", "Cross-judge table: gain under each judge, agreement and Cohen's kappa",
          needs_two_judges)
def cross_judge(tables: dict) -> pd.DataFrame:
    return cross_judge_table(get_table(tables, "scores"))
