"""LongMemEval's own metrics, as the benchmark's ``print_qa_metrics.py`` reports them, from the verdicts of its own
judge prompts (``judge_lme`` scores: ``--judge-template longmemeval``, :mod:`relaylens.scoring.longmemeval_judge`).

One row per (selector, budget, condition) and LongMemEval judge (``judge_lme``, or ``judge_lme_<name>`` from
``relaylens judge --judge-template longmemeval``):

* accuracy per question type (the six types, abstention questions counted in their own type, as upstream);
* **task-averaged** accuracy: the mean of the type means, over the types the rows hold (upstream prints NaN when a
  type has no question; a subset of the benchmark may lack one, and the ``n_types`` column says how many were averaged);
* **overall** accuracy: the mean over every question;
* **abstention** accuracy: the mean over the questions whose id contains ``_abs`` (``n_abstention`` of them);
* ``task_averaged_delta`` and ``overall_delta``: the paired difference against ``original`` (NaN for original).

Failed verdicts (the judge's backend answered nothing) are left out and counted (``failed``). Intervals are 95%
cluster-bootstrap intervals (:func:`relaylens.reporting.bootstrap.cluster_bootstrap`, 10,000 resamples, seed 0);
the task-averaged ones resample each type's clusters within the type, so every resample keeps every type.

Example:
    >>> import pandas as pd
    >>> rows = [dict(record_id=rid, selector="bm25", budget=0.1, condition="original", question_type=qt,
    ...              cluster_id=None, metric="judge_lme", value=v)
    ...         for rid, qt, v in [("a", "multi-session", 1.0), ("b", "multi-session", 1.0),
    ...                            ("c", "multi-session", 1.0), ("d_abs", "knowledge-update", 0.0)]]
    >>> t = longmemeval_metrics_table({"scores": pd.DataFrame(rows)}, n_resamples=200)
    >>> t[["multi-session", "knowledge-update", "task_averaged", "overall", "abstention"]].values.tolist()
    [[1.0, 0.0, 0.5, 0.75, 0.0]]
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from relaylens.reporting import summaries
from relaylens.reporting.bootstrap import BootstrapResult, cluster_bootstrap, cluster_ids
from relaylens.reporting.figures.registry import register
from relaylens.reporting.summaries import REFERENCE, condition_order
from relaylens.results.tables import get_table
from relaylens.scoring.longmemeval_judge import METRIC, QUESTION_TYPES

__all__ = ["lme_metrics", "task_averaged", "longmemeval_metrics_table", "needs_lme_scores", "COLUMNS"]

_LME = re.compile(rf"^{METRIC}(_[a-z0-9_]+)?$")
ACCURACIES = [*QUESTION_TYPES, "task_averaged", "task_averaged_delta", "overall", "overall_delta", "abstention"]
COLUMNS = (["selector", "budget", "condition", "judge", "n", "failed"]
           + [c + s for c in ACCURACIES for s in ("", "_low", "_high")] + ["n_types", "n_abstention"])


def lme_metrics(scores: pd.DataFrame) -> list[str]:
    """The LongMemEval judge metrics of a scores table (``judge_lme``, ``judge_lme_<name>``), failure flags excluded.

    >>> lme_metrics(pd.DataFrame({"metric": ["judge", "judge_lme_q15", "judge_lme", "judge_lme_failed"]}))
    ['judge_lme', 'judge_lme_q15']
    """
    present = scores["metric"].unique() if len(scores) else []
    return sorted(m for m in present if _LME.match(m) and not m.endswith("_failed"))


def needs_lme_scores(tables: dict) -> str | None:
    """Why the table cannot be built (no LongMemEval judge verdicts), or None."""
    if lme_metrics(get_table(tables, "scores")):
        return None
    return ("no judge_lme scores (LongMemEval's own judge prompts). Fix: relaylens judge RUN_DIR --judge-template "
            "longmemeval --judge-model NAME, or run with --judge-template longmemeval")


def task_averaged(values, types, clusters, n_resamples: int = 10_000, seed: int = 0,
                  level: float = 0.95) -> BootstrapResult:
    """The mean of the per-type means of ``values`` (over the types present) with a percentile interval from a
    stratified cluster bootstrap: each resample draws every type's clusters with replacement within that type.

    >>> r = task_averaged(np.array([1.0, 1.0, 1.0, 0.0]), np.array(["a", "a", "a", "b"]),
    ...                   np.array(["1", "2", "3", "4"]))
    >>> r.mean, r.low, r.high, r.n_clusters, r.n
    (0.5, 0.5, 0.5, 4, 4)
    """
    values = np.asarray(values, dtype=np.float64)
    types, clusters = np.asarray(types, dtype=object).astype(str), np.asarray(clusters, dtype=object).astype(str)
    if values.size == 0:
        return BootstrapResult(np.nan, np.nan, np.nan, 0, 0, level=level)
    present = sorted(set(types))
    rng = np.random.default_rng(seed)
    stats = np.zeros(n_resamples)  # [resample]: sum over types of the resampled type mean
    for kind in present:
        mask = types == kind
        _, inverse = np.unique(clusters[mask], return_inverse=True)
        sums = np.bincount(inverse, weights=values[mask])  # [cluster of this type]
        counts = np.bincount(inverse).astype(np.float64)  # [cluster of this type]
        draw = rng.integers(0, sums.size, size=(n_resamples, sums.size))  # [resample, drawn cluster]
        stats += sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    stats /= len(present)
    point = float(np.mean([values[types == kind].mean() for kind in present]))
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return BootstrapResult(point, float(low), float(high), int(np.unique(clusters).size), int(values.size), level=level)


def _put(row: dict, name: str, result: BootstrapResult) -> None:
    row[name], row[f"{name}_low"], row[f"{name}_high"] = result.mean, result.low, result.high


def _row(g: pd.DataFrame, reference: pd.DataFrame | None, n_resamples: int) -> dict:
    """The accuracies of one (setting, condition, judge) group's rows (valid verdicts only), paired against the
    reference condition's rows of the same setting when given."""
    valid = g[g["value"].notna()]
    values, types = valid["value"].to_numpy(np.float64), valid["question_type"].astype(str).to_numpy()
    clusters = cluster_ids(valid)
    row = {"n": len(valid), "failed": len(g) - len(valid), "n_types": len(set(types))}
    for kind in QUESTION_TYPES:
        mask = types == kind
        _put(row, kind, cluster_bootstrap(values[mask], clusters[mask], n_resamples, seed=0))
    _put(row, "task_averaged", task_averaged(values, types, clusters, n_resamples))
    _put(row, "overall", cluster_bootstrap(values, clusters, n_resamples, seed=0))
    abstains = valid["record_id"].astype(str).str.contains("_abs", regex=False).to_numpy()
    _put(row, "abstention", cluster_bootstrap(values[abstains], clusters[abstains], n_resamples, seed=0))
    row["n_abstention"] = int(abstains.sum())
    if reference is not None:  # paired by record: both verdicts valid
        pair = valid.merge(reference[reference["value"].notna()][["record_id", "value"]], on="record_id",
                           suffixes=("", "_ref"))
        diff = (pair["value"] - pair["value_ref"]).to_numpy(np.float64)
        kinds, ids = pair["question_type"].astype(str).to_numpy(), cluster_ids(pair)
        _put(row, "task_averaged_delta", task_averaged(diff, kinds, ids, n_resamples))
        _put(row, "overall_delta", cluster_bootstrap(diff, ids, n_resamples, seed=0))
    return row


def longmemeval_metrics_table(tables: dict, n_resamples: int | None = None) -> pd.DataFrame:
    """One row per (model and dataset of a grid, selector, budget, condition, judge): see the module docstring
    (``n_resamples``: :data:`relaylens.reporting.summaries.N_RESAMPLES` by default, as every other table)."""
    n_resamples = n_resamples or summaries.N_RESAMPLES
    scores = get_table(tables, "scores")
    labels = [c for c in ("model", "dataset") if c in scores.columns]  # several runs: the model x dataset grid
    rows = []
    for metric in lme_metrics(scores):
        frame = scores[scores["metric"] == metric]
        for setting, g in frame.groupby([*labels, "selector", "budget"], sort=True):
            reference = g[g["condition"] == REFERENCE] if (g["condition"] == REFERENCE).any() else None
            for condition in condition_order(g["condition"].unique()):
                paired = reference if condition != REFERENCE else None
                rows.append(dict(zip([*labels, "selector", "budget"], setting)) | {"condition": condition,
                                                                                   "judge": metric}
                            | _row(g[g["condition"] == condition], paired, n_resamples))
    out = pd.DataFrame(rows, columns=labels + COLUMNS)
    out["budget"] = out["budget"].astype(np.float64)
    counts = scores[scores["metric"].isin(lme_metrics(scores))].drop_duplicates("record_id")
    per_type = counts["question_type"].value_counts()
    abstentions = int(counts["record_id"].astype(str).str.contains("_abs", regex=False).sum())
    out.attrs["note"] = ("Questions judged: " + ", ".join(f"{t} {int(per_type.get(t, 0))}" for t in QUESTION_TYPES)
                         + f"; abstention (_abs ids, also counted in their type) {abstentions}. Task-averaged: mean of "
                         "the type means (print_qa_metrics.py); its interval resamples clusters within each type.")
    return out


@register("longmemeval_metrics", "table", "LongMemEval's own metrics (its judge prompts): accuracy per question type, "
          "task-averaged, overall and abstention (95% cluster-bootstrap intervals)", needs_lme_scores)
def longmemeval_metrics(tables: dict) -> pd.DataFrame:
    return longmemeval_metrics_table(tables)
