"""How far a judge can be trusted on this run: each LLM judge's verdicts against ``contains`` over the same answers,
per condition and pooled (``all``): accuracy under each, raw agreement, Cohen's kappa, the 2x2 counts, and the
judge's failures (replies that were not a verdict; left out of every other column).

A judge that is right where ``contains`` is (both correct) and adds what ``contains`` cannot see (paraphrases,
abstentions, rubric references) shows up as ``judge_only``; a judge that misses plain string matches shows up as
``contains_only``. Drawn with Figure 4 and Table 1 when the run has a judge (``relaylens judge RUN_DIR``).

Example:
    >>> import pandas as pd
    >>> rows = [dict(record_id=f"r{i}", selector="bm25", budget=0.1, condition=c, metric=m, value=v)
    ...         for i, (c, j, k) in enumerate([("original", 1.0, 1.0), ("original", 0.0, 1.0), ("relay", 1.0, 0.0),
    ...                                        ("relay", float("nan"), 0.0)])
    ...         for m, v in (("judge_x", j), ("judge_x_failed", float(j != j)), ("contains", k))]
    >>> t = judge_agreement_table({"scores": pd.DataFrame(rows)})
    >>> columns = ["answers", "failed", "n", "both_correct", "judge_only", "contains_only"]
    >>> t[t.condition == "all"][columns].values.tolist()
    [[4, 1, 3, 1, 1, 1]]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import condition_order
from relaylens.results.tables import get_table
from relaylens.scoring.agreement import cohen_kappa, judge_metrics

REFERENCE_METRIC = "contains"
COLUMNS = ["selector", "budget", "judge", "condition", "answers", "failed", "n", "judge_accuracy",
           "contains_accuracy", "agreement", "kappa", "both_correct", "judge_only", "contains_only"]


def needs_judge_and_contains(tables: dict) -> str | None:
    scores = get_table(tables, "scores")
    if not len(scores) or REFERENCE_METRIC not in set(scores["metric"]):
        return "no contains scores in the run"
    return None if judge_metrics(scores) else "no judge scored the run (`relaylens judge RUN_DIR`)"


def _row(g: pd.DataFrame, judge: str) -> dict:
    """The counts and rates of one group's wide rows (columns: the judge, its failure flag, contains)."""
    failed = g[f"{judge}_failed"].fillna(0.0) > 0 if f"{judge}_failed" in g else g[judge].isna()
    valid = g[~failed & g[judge].notna() & g[REFERENCE_METRIC].notna()]
    j, c = valid[judge].to_numpy(np.float64), valid[REFERENCE_METRIC].to_numpy(np.float64)
    return {"answers": len(g), "failed": int(failed.sum()), "n": len(valid),
            "judge_accuracy": float(j.mean()) if len(j) else np.nan,
            "contains_accuracy": float(c.mean()) if len(c) else np.nan,
            "agreement": float((j == c).mean()) if len(j) else np.nan, "kappa": cohen_kappa(j, c),
            "both_correct": int(((j == 1) & (c == 1)).sum()), "judge_only": int(((j == 1) & (c == 0)).sum()),
            "contains_only": int(((j == 0) & (c == 1)).sum())}


def judge_agreement_table(tables: dict) -> pd.DataFrame:
    """One row per (selector, budget, judge, condition), plus ``all`` conditions pooled (see the module docstring)."""
    scores = get_table(tables, "scores")
    judges = judge_metrics(scores)
    key = ["record_id", "selector", "budget", "condition"]
    wanted = [REFERENCE_METRIC] + judges + [f"{j}_failed" for j in judges]
    wide = (scores[scores["metric"].isin(wanted)].groupby(key + ["metric"], sort=True)["value"].first()
            .unstack("metric").reset_index())  # [answer, metric]: only the answers the run has
    rows = []
    for (selector, budget), setting in wide.groupby(["selector", "budget"], sort=True):
        conditions = condition_order(setting["condition"].unique())
        for judge in judges:
            if judge not in setting:
                continue
            for condition in [*conditions, "all"]:
                g = setting if condition == "all" else setting[setting["condition"] == condition]
                rows.append({"selector": selector, "budget": float(budget), "judge": judge, "condition": condition,
                             **_row(g, judge)})
    return pd.DataFrame(rows, columns=COLUMNS)


@register("judge_agreement", "table", "Judge vs contains: accuracy under each, raw agreement, Cohen's kappa and the "
          "2x2 counts per condition", needs_judge_and_contains)
def judge_agreement(tables: dict) -> pd.DataFrame:
    return judge_agreement_table(tables)
