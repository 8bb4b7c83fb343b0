"""Table 3 from run tables: the overhead of each condition over ``original`` in complete-request time (torch-free).

A complete request is ``prefill_s + selection_s + elapsed_s`` of an answer row decoded on its own (``batch_rows ==
1``; ``relaylens run overhead`` runs that way). Per (record, selector, budget) the request times of each condition are
reduced to their median (several repetitions may be present), divided by the ``original`` request of the same
record, selector and budget (the pairing), and the ratios are combined as a geometric mean minus one — the paper's
statistic, and the one ``relaylens bench overhead`` reports. Rows decoded in batches of several rows carry no
per-request time: their ``overhead_pct`` is NaN and ``timing`` says ``batched``.

Example:
    >>> import pandas as pd
    >>> rows = [dict(record_id=r, selector="snapkv", budget=256.0, condition=c, prefill_s=1.0, selection_s=0.1,
    ...              elapsed_s=e, new_tokens=8, batch_rows=1)
    ...         for r in ("a", "b") for c, e in (("original", 0.9), ("relay", 0.9 + (0.04 if r == "a" else 0.0)))]
    >>> table = overhead_table(pd.DataFrame(rows))
    >>> table[["condition", "n", "overhead_pct"]].round(3).values.tolist()
    [['original', 2, 0.0], ['relay', 2, 0.995]]
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

REFERENCE = "original"
PAIR = ["record_id", "selector", "budget"]


def request_times(answers: pd.DataFrame) -> pd.DataFrame:
    """``answers`` with ``request_s`` (NaN for rows decoded in a batch of several rows, or without stage times)."""
    out = answers.copy()
    if not {"prefill_s", "selection_s"} <= set(out.columns):
        out["request_s"] = np.nan
        out["timing"] = "no stage times"
        return out
    single = out["batch_rows"] == 1 if "batch_rows" in out.columns else pd.Series(True, index=out.index)
    out["request_s"] = (out["prefill_s"] + out["selection_s"] + out["elapsed_s"]).where(single)
    out["timing"] = np.where(single, "per request", "batched")
    return out


def geometric_mean_minus_one(ratios) -> float:
    """Table 3's statistic: ``exp(mean(log r)) - 1`` over the finite positive ratios; NaN when there are none.

    >>> round(geometric_mean_minus_one([1.01, 1.03]), 4), geometric_mean_minus_one([2.0, 0.5])
    (0.02, 0.0)
    """
    values = [float(r) for r in ratios if r is not None and math.isfinite(r) and r > 0]
    return math.exp(sum(math.log(r) for r in values) / len(values)) - 1 if values else float("nan")


def overhead_table(answers: pd.DataFrame) -> pd.DataFrame:
    """One row per (selector, budget, condition): request time, decoding time and the paired overhead over original."""
    timed = request_times(answers)
    medians = timed.groupby(PAIR + ["condition"], sort=True).agg(
        request_s=("request_s", "median"), elapsed_s=("elapsed_s", "median"), new_tokens=("new_tokens", "median"),
        timing=("timing", "first")).reset_index()
    reference = medians[medians["condition"] == REFERENCE][PAIR + ["request_s"]].rename(columns={"request_s": "_ref"})
    paired = medians.merge(reference, on=PAIR, how="left")
    paired["ratio"] = paired["request_s"] / paired["_ref"]
    rows = []
    for (selector, budget, condition), group in paired.groupby(["selector", "budget", "condition"], sort=True):
        tokens = group["new_tokens"].mean()
        rows.append({
            "selector": selector, "budget": budget, "condition": condition, "n": len(group),
            "timing": "batched" if (group["timing"] == "batched").any() else group["timing"].iloc[0],
            "request_s_mean": group["request_s"].mean(), "elapsed_s_mean": group["elapsed_s"].mean(),
            "new_tokens_mean": tokens, "s_per_token": group["elapsed_s"].mean() / tokens if tokens > 0 else np.nan,
            "overhead_pct": 100 * geometric_mean_minus_one(group["ratio"]),
        })
    return pd.DataFrame(rows)
