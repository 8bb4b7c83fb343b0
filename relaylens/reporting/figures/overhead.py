"""Table 3 (``relaylens/analyses/overhead.py``): complete-request time per condition and the paired overhead over
original.

The statistic lives in :mod:`relaylens.reporting.overhead` (``relaylens bench overhead`` reports the same one).
"""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.figures.registry import needs_answers, register
from relaylens.reporting.overhead import overhead_table
from relaylens.reporting.summaries import condition_order
from relaylens.results.tables import get_table


@register("table3", "table", "Table 3: complete-request time per condition and overhead over original", needs_answers)
def table3(tables: dict) -> pd.DataFrame:
    """Request time (prefill + selection + question + decoding) and the paired geometric-mean overhead (NaN for
    rows decoded in batches of several rows)."""
    out = overhead_table(get_table(tables, "answers"))
    cond_rank = {c: i for i, c in enumerate(condition_order(out["condition"]))}
    out = out.assign(_c=out["condition"].map(cond_rank)).sort_values(["selector", "budget", "_c"], kind="mergesort")
    return out.drop(columns=["_c"]).reset_index(drop=True)
