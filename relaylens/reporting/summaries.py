"""Every statistic of the result tables behind the figures and the report: bootstrap means, paired differences,
the accuracy table, RandomMean, early / middle / late band tables (the bands themselves:
:mod:`relaylens.conditions.bands`), per-layer tables and Markdown rendering. Tables only (columns of
:mod:`relaylens.results.tables`): no torch, no model, no drawing.

Example:
    >>> alpha_of("half_gap"), alpha_of("relay"), alpha_of("compaction(0.25)"), alpha_of("key_only")
    (0.5, 1.0, 0.25, None)
    >>> condition_order(["relay", "random_order(1)", "original", "compaction(0.5)", "RandomMean"])
    ['original', 'relay', 'RandomMean', 'random_order(1)', 'compaction(0.5)']
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd

from relaylens import moved_name
from relaylens.conditions.bands import band_of
from relaylens.reporting.bootstrap import cluster_bootstrap, cluster_ids, condition_means
from relaylens.results.tables import SWEEP_SOURCE, get_table

FALLBACK_METRICS = ("contains", "f1")  # read when a run has no judge or choice metric
"""Accuracy metrics reported when a run has neither judge verdicts nor multiple-choice answers (the fallback of
:func:`relaylens.reporting.crossrun.choose_metrics`; ``tables["metrics"]`` carries the chosen ones)."""
METRIC_ORDER = ("judge", "choice_accuracy", "contains", "f1", "exact_match")
"""The order metrics appear in tables and panels (``judge_<name>`` of other judges follow)."""
N_RESAMPLES = 10_000
REFERENCE = "original"
SHARE_METRICS = ("evidence_share", "history_share", "replay_gold_share", "evidence_grad_x_input_share")
"""Metrics that are probability shares: their band deltas are reported in percentage points."""
CONDITION_FAMILIES = ["original", "relay", "half_gap", "key_only", "query_only", "common_shift", "rank_sync",
                      "score_order", "reverse_order", "RandomMean", "random_order", "compaction"]
"""Condition families in the canonical plotting order."""


def budget_label(b: float) -> str:
    """``0.1`` -> ``'10%'`` (a retention ratio); ``64`` -> ``'64'`` (states)."""
    return f"{b * 100:g}%" if b <= 1 else f"{b:g}"


def condition_family(condition: str) -> str:
    """``'random_order(3)'`` -> ``'random_order'``."""
    return re.sub(r"\(.*\)$", "", str(condition))


def condition_order(conditions: Sequence[str]) -> list[str]:
    """Conditions in the canonical plotting order (original first, relay second, families, then parameters)."""

    def key(c: str) -> tuple:
        fam = condition_family(c)
        rank = CONDITION_FAMILIES.index(fam) if fam in CONDITION_FAMILIES else len(CONDITION_FAMILIES)
        nums = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", c[len(fam):])]
        return (rank, fam, nums, c)

    return sorted(dict.fromkeys(str(c) for c in conditions), key=key)


# ------------------------------------------------------------------------------------------------------ bands

def band_table(frame: pd.DataFrame, num_layers: int, keys: list[str], boundaries: tuple[int, int] | None = None,
               reference: str = REFERENCE) -> pd.DataFrame:
    """Mean of each metric per band (layers, then heads pooled) and its difference against ``reference``.

    ``frame`` has columns ``keys + ["condition", "layer", "head", "metric", "value"]``; ``delta`` is in the
    metric's units, ``delta_pp`` = 100 x delta for share metrics (NaN otherwise).
    """
    data = frame.assign(band=frame["layer"].map(band_of(num_layers, boundaries)))
    per_layer = data.groupby(keys + ["condition", "metric", "band", "layer"],
                             dropna=False)["value"].mean().reset_index()
    table = per_layer.groupby(keys + ["condition", "metric", "band"], dropna=False)["value"].mean().reset_index()
    base = table[table["condition"] == reference].drop(columns="condition").rename(columns={"value": "reference_value"})
    table = table.merge(base, on=keys + ["metric", "band"], how="left")
    table["delta"] = table["value"] - table["reference_value"]
    table["delta_pp"] = np.where(table["metric"].isin(SHARE_METRICS), 100.0 * table["delta"], np.nan)
    return table


# ------------------------------------------------------------------------------------------------- accuracy

def metric_list(scores: pd.DataFrame) -> list[str]:
    """Metrics present in ``scores`` in :data:`METRIC_ORDER` (then ``judge_<name>`` and others, sorted); failure
    flags excluded.

    >>> metric_list(pd.DataFrame({"metric": ["f1", "judge_b", "judge", "judge_failed"]}))
    ['judge', 'f1', 'judge_b']
    """
    present = set(scores["metric"].unique()) if len(scores) else set()
    rank = {m: i for i, m in enumerate(METRIC_ORDER)}
    return sorted((m for m in present if not m.endswith("_failed")), key=lambda m: (rank.get(m, len(rank)), m))


def accuracy_scores(tables: dict, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """The ``scores`` rows of the metrics the tables report: ``metrics``, else ``tables["metrics"]`` (the
    ``--metric`` choice, :func:`relaylens.reporting.crossrun.choose_metrics`), else :data:`FALLBACK_METRICS`; empty,
    with the schema's columns, when none."""
    scores = get_table(tables, "scores")
    chosen = metrics or tables.get("metrics") or FALLBACK_METRICS
    return scores[scores["metric"].isin(chosen)]


def forward_evidence_share(probes: pd.DataFrame) -> pd.DataFrame:
    """The forward-pass ``evidence_share`` rows at the final question token."""
    return probes[(probes["metric"] == "evidence_share") & (probes["source"] == "forward")
                  & (probes["probe_point"] == "question_final")]


EVIDENCE_PP = "evidence_share_pp"
"""The per-record evidence quantity of the paired tables: percentage points, as the results pages quote it."""


def record_evidence_share_pp(tables: dict, labels: Sequence[str] = (), source: str = "forward") -> pd.DataFrame:
    """Long per-record rows (``labels``, ``record_id, selector, budget, condition, cluster_id``, ``metric`` =
    :data:`EVIDENCE_PP`, ``value``): the final question token's evidence share averaged over layers and query heads,
    times 100, from ``source`` (``forward``, or the layer sweep's :data:`SWEEP_SOURCE`); cluster ids from the scores
    table per (``labels``, record, selector, budget), so sweep conditions without answers get theirs. Empty without."""
    unit, probes = list(labels) + ["record_id", "selector", "budget"], get_table(tables, "probes")
    key = unit + ["condition"]
    share = probes[(probes["source"] == source) & (probes["metric"] == "evidence_share")
                   & (probes["probe_point"] == "question_final")]
    if not len(share):
        return pd.DataFrame(columns=key + ["cluster_id", "metric", "value"])
    clusters = get_table(tables, "scores")[unit + ["cluster_id"]].drop_duplicates(unit)
    means = share.groupby(key, sort=True)["value"].mean().mul(100.0).reset_index().merge(clusters, on=unit, how="left")
    return means.assign(metric=EVIDENCE_PP)[key + ["cluster_id", "metric", "value"]]


def quantity_list(rows: pd.DataFrame) -> list[str]:
    """The accuracy metrics of long rows in reporting order (:func:`metric_list`), then :data:`EVIDENCE_PP` when
    the rows have it."""
    evidence = rows["metric"] == EVIDENCE_PP
    return metric_list(rows[~evidence]) + ([EVIDENCE_PP] if evidence.any() else [])


def accuracy_means(scores: pd.DataFrame, by: Sequence[str], metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Per-group means with cluster-bootstrap intervals, long over ``metric``."""
    frames = [condition_means(scores, m, by=tuple(by), n_resamples=N_RESAMPLES).assign(metric=m)
              for m in (metrics or metric_list(scores)) if (scores["metric"] == m).any()]
    if not frames:
        return pd.DataFrame(columns=list(by) + ["mean", "low", "high", "n_clusters", "n", "n_dropped", "metric"])
    return pd.concat(frames, ignore_index=True)


def paired_deltas(scores: pd.DataFrame, by: Sequence[str], reference: str = REFERENCE,
                  metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """``condition - reference`` per group of ``by`` and metric, paired by (record, selector, budget) and
    cluster-bootstrapped with :func:`relaylens.reporting.bootstrap.cluster_bootstrap` (pairs with a NaN side are
    dropped).

    Same statistic as :func:`relaylens.reporting.bootstrap.paired_difference`, pivoted once instead of once per pair."""
    by = list(by)
    rows = []
    pair = ["record_id", "selector", "budget"]
    for metric in (metrics or metric_list(scores)):
        df = scores[scores["metric"] == metric]
        if df.empty or reference not in set(df["condition"]):
            continue
        df = df.assign(_cluster=cluster_ids(df))  # the one missing-cluster rule of relaylens.reporting.bootstrap
        index = list(dict.fromkeys(by + pair + ["_cluster"]))
        wide = df.set_index(index + ["condition"])["value"].astype(np.float64).unstack("condition")
        groups = wide.groupby(level=by, sort=True) if by else [((), wide)]
        for group, g in groups:
            group = group if isinstance(group, tuple) else (group,)
            clusters = g.index.get_level_values("_cluster").to_numpy()
            for cond in condition_order(c for c in g.columns if c != reference):
                diff = (g[cond] - g[reference]).to_numpy(dtype=np.float64)
                ok = np.isfinite(diff)
                if not ok.any():
                    continue
                res = cluster_bootstrap(diff[ok], clusters[ok], n_resamples=N_RESAMPLES, seed=0)
                rows.append(dict(zip(by, group)) | {"condition": cond, "metric": metric, "mean": res.mean,
                                                    "low": res.low, "high": res.high, "n": res.n})
    return pd.DataFrame(rows, columns=by + ["condition", "metric", "mean", "low", "high", "n"])


def win_loss(scores: pd.DataFrame, by: Sequence[str], reference: str = REFERENCE) -> pd.DataFrame:
    """Per group of ``by``, condition (not ``reference``) and metric: ``wins`` / ``losses`` (pairs where the
    condition is above / below ``reference``) among ``n`` complete pairs, paired by (record, selector, budget) as
    in :func:`paired_deltas`.

    >>> rows = pd.DataFrame({"record_id": ["a", "a", "b", "b", "c", "c"], "selector": "bm25", "budget": 0.1,
    ...                      "condition": ["original", "relay"] * 3, "metric": "contains",
    ...                      "value": [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]})
    >>> win_loss(rows, []).to_dict("records")
    [{'condition': 'relay', 'metric': 'contains', 'wins': 1, 'losses': 1, 'n': 3}]
    """
    by = list(by)
    index = list(dict.fromkeys(by + ["metric", "record_id", "selector", "budget"]))
    wide = scores.groupby(index + ["condition"], sort=True)["value"].first().astype(np.float64).unstack("condition")
    columns = by + ["condition", "metric", "wins", "losses", "n"]
    if reference not in wide.columns:
        return pd.DataFrame(columns=columns)
    frames = []
    for cond in condition_order(c for c in wide.columns if c != reference):
        diff = (wide[cond] - wide[reference]).dropna().rename("diff").reset_index()
        counts = diff.groupby(by + ["metric"], sort=True)["diff"].agg(
            wins=lambda d: int((d > 0).sum()), losses=lambda d: int((d < 0).sum()), n="size").reset_index()
        frames.append(counts.assign(condition=cond))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    return out[columns].astype({"wins": int, "losses": int, "n": int})


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
    vs original (``delta``; ``delta_pp`` for share metrics). Sweep rows (``source = "sweep"``) are left out: the
    ``layer_scope`` figure draws them."""
    probes = probes[probes["source"] != SWEEP_SOURCE]
    num_layers = int(probes["layer"].max()) + 1
    keys = ["probe_point", "source", "metric", "condition", "layer"]
    table = probes.groupby(keys, sort=True)["value"].mean().reset_index()
    table["band"] = table["layer"].map(band_of(num_layers))
    base = table[table["condition"] == REFERENCE].drop(columns=["condition", "band"]).rename(columns={"value": "ref"})
    table = table.merge(base, on=["probe_point", "source", "metric", "layer"], how="left")
    table["delta"] = table["value"] - table["ref"]
    table["delta_pp"] = np.where(table["metric"].isin(SHARE_METRICS), 100 * table["delta"], np.nan)
    return table.drop(columns="ref")


def alpha_of(condition: str) -> float | None:
    """The compaction alpha of a condition: original 0, half_gap 0.5, relay 1, ``compaction(a)`` a; else None."""
    fixed = {"original": 0.0, "half_gap": 0.5, "relay": 1.0}
    if condition in fixed:
        return fixed[condition]
    m = re.fullmatch(r"compaction\(([-+0-9.eE]+)\)", condition)
    return float(m.group(1)) if m else None


def table_cells(df: pd.DataFrame, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    """Header and formatted rows of a table; ``x, x_low, x_high`` columns become one ``x [low, high]`` cell."""
    cols = [c for c in df.columns if not re.search(r"_(low|high)$", c)]

    def fmt(v, col: str = "") -> str:
        if col == "budget" and isinstance(v, (float, np.floating)):
            return budget_label(float(v))
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
            cells.append(cell)
        rows.append(cells)
    head = [c + (" [95% CI]" if f"{c}_low" in df.columns else "") for c in cols]
    return head, rows


def table_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A Markdown table; ``x, x_low, x_high`` columns are shown together as ``x [low, high]``."""
    head, rows = table_cells(df, digits)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def accuracy_table(tables: dict, by: Sequence[str] = ("selector", "budget")) -> pd.DataFrame:
    """Wide accuracy table: one row per ``by + condition``; per metric ``m, m_low, m_high`` and the paired
    difference vs original ``m_delta, m_delta_low, m_delta_high`` (NaN for original); ``n`` = scored records."""
    scores = accuracy_scores(tables)
    by = list(by)
    means = accuracy_means(scores, by + ["condition"])
    deltas = paired_deltas(scores, by)
    keys = by + ["condition"]
    out = None
    for metric in metric_list(scores):
        m = means[means["metric"] == metric]
        if m.empty:
            continue
        part = m[keys + ["mean", "low", "high", "n"]].rename(
            columns={"mean": metric, "low": f"{metric}_low", "high": f"{metric}_high", "n": f"n_{metric}"})
        d = deltas[deltas["metric"] == metric][keys + ["mean", "low", "high"]].rename(
            columns={"mean": f"{metric}_delta", "low": f"{metric}_delta_low", "high": f"{metric}_delta_high"})
        part = part.merge(d, on=keys, how="left")
        out = part if out is None else out.merge(part, on=keys, how="outer")
    n_cols = [c for c in out.columns if c.startswith("n_")]
    out.insert(len(keys), "n", out[n_cols].max(axis=1).astype("int64"))
    out = out.drop(columns=n_cols)
    order = {c: i for i, c in enumerate(condition_order(out["condition"]))}
    out = out.assign(_o=out["condition"].map(order)).sort_values(by + ["_o"], kind="mergesort").drop(columns="_o")
    return out.reset_index(drop=True)


def run_overview(tables: dict[str, pd.DataFrame], metric: str = "contains") -> pd.DataFrame:
    """Plain means of ``metric`` and ``f1`` (when scored) per (selector, budget, condition), with the answer-limit rate
    (the quick summary ``relaylens run`` prints; no intervals)."""
    scores = tables["scores"]
    chosen = scores[scores.metric == metric].groupby(["selector", "budget", "condition"])["value"].mean().rename(metric)
    f1 = scores[scores.metric == "f1"].groupby(["selector", "budget", "condition"])["value"].mean().rename("f1")
    limit = tables["answers"].groupby(["selector", "budget", "condition"])["hit_limit"].mean().rename("hit_limit_rate")
    return pd.concat([chosen, *([f1] if len(f1) else []), limit], axis=1).reset_index()  # summaries have no F1


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
