"""Table 3 (``analyses/overhead.py``): time per request by condition, from the answers' ``elapsed_s``."""

from __future__ import annotations

import pandas as pd

from relaylens.figures.registry import needs_answers, register
from relaylens.summaries import REFERENCE, condition_order
from relaylens.tables import get_table


@register("table3", "table", "Table 3: time per request by condition (elapsed_s)", needs_answers)
def table3(tables: dict) -> pd.DataFrame:
    answers = get_table(tables, "answers")
    keys = ["selector", "budget", "condition"]
    g = answers.groupby(keys, sort=True)
    out = g.agg(n=("elapsed_s", "size"), elapsed_mean=("elapsed_s", "mean"), elapsed_median=("elapsed_s", "median"),
                new_tokens_mean=("new_tokens", "mean")).reset_index()
    out["s_per_token"] = out["elapsed_mean"] / out["new_tokens_mean"].where(out["new_tokens_mean"] > 0)
    ref = out[out["condition"] == REFERENCE][["selector", "budget", "elapsed_mean"]].rename(
        columns={"elapsed_mean": "_ref"})
    out = out.merge(ref, on=["selector", "budget"], how="left")
    out["ratio_vs_original"] = out["elapsed_mean"] / out["_ref"]
    cond_rank = {c: i for i, c in enumerate(condition_order(out["condition"]))}
    out = out.assign(_c=out["condition"].map(cond_rank)).sort_values(["selector", "budget", "_c"], kind="mergesort")
    return out.drop(columns=["_ref", "_c"]).reset_index(drop=True)
