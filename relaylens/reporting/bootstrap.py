"""Paired cluster bootstrap over long-format score tables (``scores`` of :mod:`relaylens.results.tables`).

A *pair* is one (record_id, selector, budget) seen under two conditions (they share one selection). A *cluster*
is the resampling unit: ``cluster_id`` (a Long-MT-Bench+ conversation, a PersonaMem persona, an InfiniteBench
book), or the record itself when ``cluster_id`` is missing (LongMemEval). *Missing* is one rule, here and only
here (:func:`cluster_ids`, used by every statistic and by the cross-run labels): no ``cluster_id`` column, None /
NaN, or a string that is empty, blank, ``"None"`` or ``"nan"`` after stripping (what a None becomes in a text
round trip) -- such rows are their own record's cluster, never one shared cluster. Each resample draws clusters with
replacement and recomputes the pooled mean over the pairs of the drawn clusters; the interval is the percentile
interval of those means. Pairs whose value is NaN in either condition (judge failures) are dropped and counted.

Example:
    >>> import pandas as pd
    >>> rows = [dict(record_id=f"r{i}", selector="bm25", budget=0.1, condition=c, metric="f1", cluster_id=None,
    ...              value=float(i % 2) + (0.2 if c == "relay" else 0.0))
    ...         for i in range(40) for c in ("original", "relay")]
    >>> res = paired_difference(pd.DataFrame(rows), "f1", n_resamples=2000)
    >>> round(res.mean, 3), res.low <= 0.2 <= res.high, res.n_clusters
    (0.2, True, 40)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from relaylens.errors import RelaylensError

__all__ = ["BootstrapResult", "paired_difference", "paired_difference_table", "condition_means", "cluster_bootstrap",
           "cluster_ids", "missing_cluster", "paired_values", "few_clusters", "MISSING_CLUSTER_IDS", "MIN_CLUSTERS"]

PAIR_COLUMNS = ["record_id", "selector", "budget"]
MISSING_CLUSTER_IDS = ("", "None", "nan")
"""``cluster_id`` strings (after stripping) that mean "no cluster": the record is its own cluster."""
MIN_CLUSTERS = 10
"""Fewer clusters than this and a percentile interval rests on a handful of distinct resample means (zero width
with one cluster, a few values with three): tables flag such rows (:func:`few_clusters`)."""


@dataclass(frozen=True)
class BootstrapResult:
    """``mean`` (point estimate), ``low``/``high`` (percentile interval at ``level``), counts."""

    mean: float
    low: float
    high: float
    n_clusters: int
    n: int
    n_dropped: int = 0
    level: float = 0.95

    def as_dict(self) -> dict:
        return asdict(self)


def cluster_bootstrap(values: np.ndarray, clusters: np.ndarray, n_resamples: int = 10_000, seed: int = 0,
                      level: float = 0.95, max_cells: int = 20_000_000) -> BootstrapResult:
    """Bootstrap the mean of ``values`` resampling ``clusters`` with replacement (vectorised, chunked so a chunk
    holds at most ``max_cells`` draws).

    >>> r = cluster_bootstrap(np.array([1.0, 1.0, 3.0, 3.0]), np.array(["a", "a", "b", "b"]), n_resamples=500)
    >>> r.mean, r.n_clusters, 1.0 <= r.low <= r.high <= 3.0
    (2.0, 2, True)
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return BootstrapResult(float("nan"), float("nan"), float("nan"), 0, 0, level=level)
    if not 0 < level < 1:
        raise RelaylensError(f"level must be in (0, 1); got {level}. Fix: pass e.g. level=0.95")
    _, inverse = np.unique(np.asarray(clusters, dtype=object).astype(str), return_inverse=True)
    sums = np.bincount(inverse, weights=values)  # [cluster]
    counts = np.bincount(inverse).astype(np.float64)  # [cluster]
    n_clusters = sums.size
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    chunk = max(1, min(n_resamples, max_cells // n_clusters))
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        draw = rng.integers(0, n_clusters, size=(stop - start, n_clusters))  # [resample, drawn cluster]
        stats[start:stop] = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return BootstrapResult(float(values.mean()), float(low), float(high), int(n_clusters), int(values.size),
                           level=level)


def missing_cluster(cluster_id: pd.Series) -> pd.Series:
    """True where a ``cluster_id`` is missing (None, NaN, or empty / ``"None"`` / ``"nan"`` after stripping).

    >>> missing_cluster(pd.Series(["book1", None, "", " None ", "nan", float("nan")])).tolist()
    [False, True, True, True, True, True]
    """
    cid = cluster_id.astype(object)
    text = cid.map(lambda v: v.strip() if isinstance(v, str) else v)
    return cid.isna() | text.isin(MISSING_CLUSTER_IDS)


def cluster_ids(df: pd.DataFrame) -> np.ndarray:
    """The resampling unit of every row: its ``cluster_id``, or its ``record_id`` where that is missing (see the
    module docstring) or where the table has no ``cluster_id`` column.

    >>> cluster_ids(pd.DataFrame({"record_id": ["r1", "r2", "r3"], "cluster_id": ["b", "None", ""]})).tolist()
    ['b', 'r2', 'r3']
    """
    if "cluster_id" not in df.columns:
        return df["record_id"].astype(str).to_numpy()
    cid = df["cluster_id"].astype(object)
    return cid.where(~missing_cluster(cid), df["record_id"]).astype(str).to_numpy()


def few_clusters(n_clusters: int, n: int | None = None) -> str:
    """The flag of a row whose interval rests on too few clusters (or on no pair at all), else ``""``.

    >>> few_clusters(3), few_clusters(12), few_clusters(0, 0)
    ('only 3 clusters (fewer than 10): interval unreliable', '', 'no valid pair')
    """
    if n == 0 or n_clusters == 0:
        return "no valid pair"
    if n_clusters >= MIN_CLUSTERS:
        return ""
    return f"only {n_clusters} cluster{'s' if n_clusters != 1 else ''} (fewer than {MIN_CLUSTERS}): interval unreliable"


def paired_values(scores: pd.DataFrame, metric: str | None, a: str, b: str) -> tuple[pd.DataFrame, int]:
    """The valid pairs of ``a`` and ``b`` (neither value NaN) as one row each -- ``record_id, selector, budget,
    _cluster, a, b`` -- and the number of pairs dropped for a NaN side. Every paired statistic, and the condition
    means printed beside it, read these rows, so the means reconcile with the paired difference."""
    df = scores if metric is None else scores[scores["metric"] == metric]
    need = set(PAIR_COLUMNS) | {"condition", "value"}
    if not need <= set(df.columns):
        raise RelaylensError(f"expected a long-format table with columns {sorted(need)} (e.g. scores); missing "
                             f"{sorted(need - set(df.columns))}. Fix: pass a run's scores or probes table")
    df = df.assign(_cluster=cluster_ids(df))
    have = sorted(df["condition"].unique())
    df = df[df["condition"].isin([a, b])]
    index = PAIR_COLUMNS + ["_cluster", "condition"]
    dup = df.duplicated(index)
    if dup.any():
        raise RelaylensError(f"several rows for one pair and condition, e.g. {df.loc[dup, index].iloc[0].tolist()}; "
                             "expected one value per (record_id, selector, budget, condition). Fix: pass metric= or "
                             "filter the table to one metric / probe readout first")
    wide = df.set_index(index)["value"].astype(np.float64).unstack("condition")
    for cond in (a, b):
        if cond not in wide.columns:
            raise RelaylensError(f"condition {cond!r} has no rows{'' if metric is None else f' for metric {metric!r}'}"
                                 f"; conditions present: {have}. Fix: compare conditions the table holds")
    both = wide[[a, b]].notna().all(axis=1)
    return wide[both].reset_index(), int((~both).sum())


def paired_difference(scores: pd.DataFrame, metric: str | None = None, a: str = "relay", b: str = "original",
                      n_resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> BootstrapResult:
    """``a`` minus ``b`` in ``metric``, paired by (record_id, selector, budget), cluster-bootstrapped.

    ``scores`` is long format (one row per key and metric, like the ``scores`` table); ``metric=None`` uses every
    row (a table already filtered to one metric, e.g. a probe readout). Filter selector/budget first, or use
    :func:`paired_difference_table`.
    """
    pairs, dropped = paired_values(scores, metric, a, b)
    diff = (pairs[a] - pairs[b]).to_numpy(dtype=np.float64)
    res = cluster_bootstrap(diff, pairs["_cluster"].to_numpy(), n_resamples, seed, level)
    return BootstrapResult(res.mean, res.low, res.high, res.n_clusters, res.n, dropped, level)


def paired_difference_table(scores: pd.DataFrame, metric: str, a: str = "relay", b: str = "original",
                            by: tuple[str, ...] = ("selector", "budget"), n_resamples: int = 10_000,
                            seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """One :func:`paired_difference` per group of ``by``: columns ``by + mean, low, high, n_clusters, n, n_dropped``."""
    rows = []
    for group, df in scores[scores["metric"] == metric].groupby(list(by), sort=True):
        group = group if isinstance(group, tuple) else (group,)
        res = paired_difference(df, None, a, b, n_resamples, seed, level)
        rows.append(dict(zip(by, group)) | {k: v for k, v in res.as_dict().items() if k != "level"})
    return pd.DataFrame(rows, columns=list(by) + ["mean", "low", "high", "n_clusters", "n", "n_dropped"])


def condition_means(scores: pd.DataFrame, metric: str, by: tuple[str, ...] = ("selector", "budget", "condition"),
                    n_resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Mean of ``metric`` per group with a cluster-bootstrap interval (bar plots); NaN values are dropped.

    Columns: ``by + mean, low, high, n_clusters, n, n_dropped``.
    """
    df = scores[scores["metric"] == metric]
    rows = []
    for group, g in df.groupby(list(by), sort=True):
        group = group if isinstance(group, tuple) else (group,)
        ok = g["value"].notna().to_numpy()
        res = cluster_bootstrap(g["value"].to_numpy(dtype=np.float64)[ok], cluster_ids(g)[ok], n_resamples, seed, level)
        rows.append(dict(zip(by, group)) | {"mean": res.mean, "low": res.low, "high": res.high,
                                            "n_clusters": res.n_clusters, "n": res.n, "n_dropped": int((~ok).sum())})
    return pd.DataFrame(rows, columns=list(by) + ["mean", "low", "high", "n_clusters", "n", "n_dropped"])
