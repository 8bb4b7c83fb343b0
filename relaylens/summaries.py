"""Statistics of the result tables behind the figures and the report: bootstrap means, paired differences,
RandomMean, per-layer tables and Markdown rendering. Tables only: no torch, no model.

Example:
    >>> alpha_of("half_gap"), alpha_of("relay"), alpha_of("compaction(0.25)"), alpha_of("key_only")
    (0.5, 1.0, 0.25, None)
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd

from relaylens import plots
from relaylens.bootstrap import cluster_bootstrap, condition_means

METRICS = ("contains", "f1")
"""Accuracy metrics reported everywhere: ``contains`` (default) and ``f1``."""
N_RESAMPLES = 10_000
REFERENCE = "original"


def _budget_label(b: float) -> str:
    return f"{b * 100:g}%" if b <= 1 else f"{b:g}"


def accuracy_means(scores: pd.DataFrame, by: Sequence[str], metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Per-group means with cluster-bootstrap intervals, long over ``metric``."""
    frames = [condition_means(scores, m, by=tuple(by), n_resamples=N_RESAMPLES).assign(metric=m)
              for m in metrics if (scores["metric"] == m).any()]
    if not frames:
        return pd.DataFrame(columns=list(by) + ["mean", "low", "high", "n_clusters", "n", "n_dropped", "metric"])
    return pd.concat(frames, ignore_index=True)


def _cluster_ids(df: pd.DataFrame) -> pd.Series:
    """The bootstrap unit of each row: ``cluster_id``, or the record when it is missing (as relaylens.bootstrap)."""
    cid = df["cluster_id"].astype(object)
    missing = cid.isna() | cid.isin(["None", ""])
    return cid.where(~missing, df["record_id"]).astype(str)


def paired_deltas(scores: pd.DataFrame, by: Sequence[str], reference: str = REFERENCE,
                  metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """``condition - reference`` per group of ``by`` and metric, paired by (record, selector, budget) and
    cluster-bootstrapped with :func:`relaylens.bootstrap.cluster_bootstrap` (pairs with a NaN side are dropped).

    Same statistic as :func:`relaylens.bootstrap.paired_difference`, pivoted once instead of once per pair."""
    by = list(by)
    rows = []
    pair = ["record_id", "selector", "budget"]
    for metric in metrics:
        df = scores[scores["metric"] == metric]
        if df.empty or reference not in set(df["condition"]):
            continue
        df = df.assign(_cluster=_cluster_ids(df))
        index = list(dict.fromkeys(by + pair + ["_cluster"]))
        wide = df.set_index(index + ["condition"])["value"].astype(np.float64).unstack("condition")
        groups = wide.groupby(level=by, sort=True) if by else [((), wide)]
        for group, g in groups:
            group = group if isinstance(group, tuple) else (group,)
            clusters = g.index.get_level_values("_cluster").to_numpy()
            for cond in plots.condition_order(c for c in g.columns if c != reference):
                diff = (g[cond] - g[reference]).to_numpy(dtype=np.float64)
                ok = np.isfinite(diff)
                if not ok.any():
                    continue
                res = cluster_bootstrap(diff[ok], clusters[ok], n_resamples=N_RESAMPLES, seed=0)
                rows.append(dict(zip(by, group)) | {"condition": cond, "metric": metric, "mean": res.mean,
                                                    "low": res.low, "high": res.high, "n": res.n})
    return pd.DataFrame(rows, columns=by + ["condition", "metric", "mean", "low", "high", "n"])


def with_random_mean(scores: pd.DataFrame) -> pd.DataFrame:
    """``scores`` plus ``RandomMean`` rows: per (record, selector, budget, metric) the mean over ``random_order(*)``."""
    rnd = scores[scores["condition"].str.match(r"random_order\(.*\)$")]
    if rnd.empty:
        return scores
    keys = ["record_id", "selector", "budget", "metric"]
    first = rnd.groupby(keys, sort=True).first().reset_index()
    mean = rnd.groupby(keys, sort=True)["value"].mean().reset_index()
    extra = first.drop(columns="value").merge(mean, on=keys).assign(condition="RandomMean")
    return pd.concat([scores, extra[scores.columns]], ignore_index=True)


def layer_table(probes: pd.DataFrame) -> pd.DataFrame:
    """Per (probe_point, source, metric, condition, layer): mean over records and heads, band, and the difference
    vs original (``delta``; ``delta_pp`` for share metrics)."""
    num_layers = int(probes["layer"].max()) + 1
    keys = ["probe_point", "source", "metric", "condition", "layer"]
    table = probes.groupby(keys, sort=True)["value"].mean().reset_index()
    table["band"] = table["layer"].map(plots.band_of(num_layers))
    base = table[table["condition"] == REFERENCE].drop(columns=["condition", "band"]).rename(columns={"value": "ref"})
    table = table.merge(base, on=["probe_point", "source", "metric", "layer"], how="left")
    table["delta"] = table["value"] - table["ref"]
    table["delta_pp"] = np.where(table["metric"].isin(plots.SHARE_METRICS), 100 * table["delta"], np.nan)
    return table.drop(columns="ref")


def alpha_of(condition: str) -> float | None:
    """The compaction alpha of a condition: original 0, half_gap 0.5, relay 1, ``compaction(a)`` a; else None."""
    fixed = {"original": 0.0, "half_gap": 0.5, "relay": 1.0}
    if condition in fixed:
        return fixed[condition]
    m = re.fullmatch(r"compaction\(([-+0-9.eE]+)\)", condition)
    return float(m.group(1)) if m else None


def table_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A Markdown table; ``x, x_low, x_high`` columns are shown together as ``x [low, high]``."""
    cols = [c for c in df.columns if not re.search(r"_(low|high)$", c)]

    def fmt(v, col: str = "") -> str:
        if col == "budget" and isinstance(v, (float, np.floating)):
            return _budget_label(float(v))
        if isinstance(v, (float, np.floating)):
            return f"{v:.{digits}f}" if np.isfinite(v) else ""
        return str(v)

    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            cell = fmt(r[c], c)
            if f"{c}_low" in df.columns and cell:
                lo, hi = r[f"{c}_low"], r[f"{c}_high"]
                if np.isfinite(lo) and np.isfinite(hi):
                    cell += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
            cells.append(cell.replace("|", "\\|"))
        rows.append(cells)
    head = [c + (" [95% CI]" if f"{c}_low" in df.columns else "") for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
