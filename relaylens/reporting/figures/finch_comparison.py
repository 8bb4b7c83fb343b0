"""Table 7 (``relaylens/analyses/finch_comparison.py``): FINCH under its own coordinates vs other selectors with
RoPERelay, same records.

Rows: one per (selector, budget, metric). ``coordinates`` is the condition the row reports (FINCH: its own,
``rank_sync``; every other selector: ``relay``); ``score`` (the mean) with a 95% cluster-bootstrap interval;
``original`` is the same selector under original coordinates (reference); ``vs_finch`` is ``row - FINCH`` paired by
record (same budget) with its interval (empty on FINCH's own row). Metrics: ``judge`` when the run was judged,
``contains``, ``f1`` and ``choice_accuracy`` when present.
"""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.bootstrap import condition_means, paired_difference
from relaylens.reporting.figures.registry import register
from relaylens.results.tables import get_table

TABLE7_METRICS = ("judge", "contains", "f1", "choice_accuracy")
FINCH = "finch"
COLUMNS = ["selector", "budget", "coordinates", "metric", "n", "score", "score_low", "score_high", "original",
           "original_low",
           "original_high", "vs_finch", "vs_finch_low", "vs_finch_high"]


FINCH_COORDINATES = "rank_sync"
"""FINCH's own coordinates (``relaylens.selectors.Finch.coordinates``; repeated here because figures import no
torch; a test keeps the two equal)."""


def native_coordinates(selector: str) -> str:
    """The condition a selector's Table 7 row reports: FINCH's own coordinates, else ``relay``."""
    return FINCH_COORDINATES if selector == FINCH else "relay"


def needs_finch(tables: dict) -> str | None:
    """Why Table 7 cannot be built (no FINCH rows under its coordinates), or None."""
    scores = get_table(tables, "scores")
    finch = scores[(scores["selector"] == FINCH) & (scores["condition"] == native_coordinates(FINCH))]
    return None if len(finch) else f"no FINCH rows under its coordinates ({native_coordinates(FINCH)})"


@register("table7", "table", "Table 7: FINCH (own coordinates) vs selectors + RoPERelay, paired differences to FINCH",
          needs_finch)
def table7(tables: dict) -> pd.DataFrame:
    """Table 7 from ``tables``: one row per (metric, budget, selector); see the module docstring for the columns."""
    scores = get_table(tables, "scores")
    rows = []
    selectors = [FINCH] + sorted(s for s in scores["selector"].unique() if s != FINCH)
    for metric in TABLE7_METRICS:
        df = scores[scores["metric"] == metric]
        if df.empty:
            continue
        for budget, b in df.groupby("budget", sort=True):
            finch = b[(b["selector"] == FINCH) & (b["condition"] == native_coordinates(FINCH))]
            for selector in selectors:
                cond = native_coordinates(selector)
                own = b[(b["selector"] == selector) & (b["condition"] == cond)]
                if own.empty:
                    continue
                mean = condition_means(own, metric, by=("condition",)).iloc[0]
                row = {"selector": selector, "budget": budget, "coordinates": cond, "metric": metric,
                       "n": int(mean["n"]), "score": mean["mean"], "score_low": mean["low"], "score_high": mean["high"]}
                ref = b[(b["selector"] == selector) & (b["condition"] == "original")]
                if not ref.empty:
                    r = condition_means(ref, metric, by=("condition",)).iloc[0]
                    row |= {"original": r["mean"], "original_low": r["low"], "original_high": r["high"]}
                if selector != FINCH and not finch.empty:
                    pair = pd.concat([own.assign(condition="method"), finch.assign(condition=FINCH)])
                    diff = paired_difference(pair.assign(selector="*"), metric, a="method", b=FINCH)
                    row |= {"vs_finch": diff.mean, "vs_finch_low": diff.low, "vs_finch_high": diff.high}
                rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
