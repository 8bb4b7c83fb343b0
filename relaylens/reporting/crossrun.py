"""Several run directories as one grid (the paper runs one directory per model x dataset), the paper's Table 8 and
the metric each table reads (torch-free).

* :func:`load_runs` labels every row with the run's ``model`` and ``dataset`` (from its manifest) and concatenates
  the tables, so Table 1 spans models and datasets and Table 8 counts settings over the whole grid.
* :func:`choose_metrics` picks the metric the tables report: ``--metric judge|choice|contains|f1|em``, by default the
  paper's metric when the run has it (judge for LongMemEval / LongMTBench+, choice accuracy for PersonaMem and
  multiple-choice InfiniteBench), otherwise contains + F1 with a note saying so.
* :func:`paired_settings_table` is the paper's Table 8: per setting (model, dataset, selector, budget) the paired
  RoPERelay - Original difference with its 95% cluster-bootstrap interval (10,000 resamples), the condition means
  over the same pairs, and the sign counts over the settings with a valid pair (:func:`settings_count`: "32 of 36
  settings improve"); settings with fewer than 10 clusters are flagged.

Example:
    >>> import pandas as pd
    >>> rows = [dict(record_id=f"r{i}", selector="bm25", budget=0.1, condition=c, metric="judge", cluster_id=None,
    ...              value=float(c == "relay" or i % 2)) for i in range(6) for c in ("original", "relay")]
    >>> choose_metrics(pd.DataFrame(rows))
    (('judge',), '')
    >>> t = paired_settings_table(pd.DataFrame(rows), "judge", n_resamples=200)
    >>> t[["selector", "original", "relay", "delta", "sign"]].values.tolist()
    [['bm25', 0.5, 1.0, 0.5, '+']]
    >>> settings_count(t)  # six records: six clusters, flagged
    '1 of 1 settings improve (1 positive, 0 negative, 0 zero); 1 setting(s) with fewer than 10 clusters (intervals unreliable)'
"""  # noqa: E501 - doctest: the expected output stays on one line

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from relaylens.errors import RelaylensError
from relaylens.reporting.bootstrap import MIN_CLUSTERS, cluster_bootstrap, few_clusters, missing_cluster, paired_values
from relaylens.results.manifest import manifest_section
from relaylens.results.store import RunStore, load_tables

__all__ = ["METRIC_NAMES", "choose_metrics", "run_label", "load_runs", "paired_settings_table", "settings_count",
           "SETTING_COLUMNS"]

METRIC_NAMES = {"judge": "judge", "choice": "choice_accuracy", "contains": "contains", "f1": "f1", "em": "exact_match",
                "quality": "quality", "factuality": "factuality", "coverage": "coverage"}
"""``--metric`` names -> ``scores.metric`` values."""
FALLBACK = ("contains", "f1")
FALLBACK_NOTE = ("no judge verdicts or multiple-choice answers in this run: contains and F1 shown (the paper's metric "
                 "is the judge or choice accuracy)")
SETTING_COLUMNS = ["model", "dataset", "selector", "budget"]
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def _has(scores: pd.DataFrame, metric: str) -> bool:
    values = scores.loc[scores["metric"] == metric, "value"]
    return bool(len(values)) and bool(values.notna().any())


def choose_metrics(scores: pd.DataFrame, requested: str | None = None) -> tuple[tuple[str, ...], str]:
    """``(metrics, note)``: the scores metrics the tables and figures report, and a note when they are not the
    paper's. ``requested`` is a ``--metric`` name (or a raw metric such as ``judge_gpt_oss_20b``), or several
    comma-separated (``contains,f1``: the first is the accuracy of single-metric tables).

    >>> frame = pd.DataFrame({"metric": ["contains", "f1", "judge_small"], "value": [1.0, 0.5, 0.0]})
    >>> choose_metrics(frame), choose_metrics(frame, "contains,f1")
    ((('judge_small',), ''), (('contains', 'f1'), ''))
    """
    if requested:
        names = [n.strip() for n in str(requested).split(",") if n.strip()]
        metrics = tuple(dict.fromkeys(METRIC_NAMES.get(n, n) for n in names))
        present = sorted(m for m in scores["metric"].unique() if not m.endswith("_failed")) if len(scores) else []
        for metric, name in zip(metrics, names):
            if not _has(scores, metric) and metric in present:  # rows there, every value NaN (issue 52, item 20)
                shown = sorted(m for m in present if _has(scores, m))
                raise RelaylensError(f"--metric {name}: every {metric!r} score of the run is NaN (nothing to draw; for "
                                     f"a judge, every verdict failed: {metric}_failed counts them). Fix: choose one of "
                                     f"{shown}, or judge the run again (`relaylens judge RUN_DIR`)")
            if not _has(scores, metric):
                raise RelaylensError(f"--metric {name}: the run has no {metric!r} scores; present: {present}. "
                                     f"Fix: choose one of those, or judge the run first (`relaylens judge RUN_DIR`)")
        if not metrics:
            raise RelaylensError(f"--metric {requested!r} names no metric. Fix: pass one of {present} (or several, "
                                 "comma-separated: contains,f1)")
        return metrics, ""
    if len(scores) == 0:
        return FALLBACK, ""
    if _has(scores, "quality") and not _has(scores, "judge"):  # checklist-judged summaries (Tables 10-11)
        return ("quality",), ""
    if _has(scores, "choice_accuracy") and not _has(scores, "judge"):
        return ("choice_accuracy",), ""
    judges = ["judge"] if _has(scores, "judge") else sorted(
        m for m in scores["metric"].unique() if m.startswith("judge_") and not m.endswith("_failed") and _has(scores,
                                                                                                              m))
    if judges:  # the run's inline judge, else the first judge added by `relaylens judge`
        if _has(scores, "choice_accuracy"):  # a grid of judged and multiple-choice datasets: each its own metric
            return (judges[0], "choice_accuracy"), ""
        return (judges[0],), ""
    return FALLBACK, FALLBACK_NOTE


def run_label(manifest: dict) -> dict[str, str]:
    """``{"model", "dataset"}`` labels of a run from its manifest (file names, not full paths; a dataset loses its
    format and compression suffixes: ``data/lme_qwen_2048.json.gz`` is ``lme_qwen_2048``)."""
    model = str(manifest_section(manifest, "model").get("spec") or "?").rstrip("/")
    dataset = manifest_section(manifest, "dataset").get("path") or "?"
    name = Path(str(dataset)).name
    for compression in COMPRESSION_SUFFIXES:
        name = name.removesuffix(compression)
    return {"model": Path(model).name or model, "dataset": Path(name).stem or name}


def load_runs(run_dirs) -> tuple[dict[str, pd.DataFrame], list[dict]]:
    """Tables of several run directories, each row labelled with its run's ``model`` and ``dataset`` (record ids
    are prefixed with the label when runs share a record id, so pairs never mix runs); returns ``(tables, labels)``."""
    frames: dict[str, list[pd.DataFrame]] = {}
    labels = []
    for run_dir in run_dirs:
        label = run_label(RunStore.open(run_dir).manifest)
        labels.append({**label, "run_dir": str(run_dir)})
        for name, frame in load_tables(run_dir).items():
            frames.setdefault(name, []).append(frame.assign(**label))
    seen = [(lab["model"], lab["dataset"]) for lab in labels]
    if len(set(seen)) != len(seen):
        raise RelaylensError(f"two of the run directories have the same model and dataset {seen}; pass one run per "
                             "model x dataset (merge shards first with `relaylens merge`)")
    tables = {}
    for name, parts in frames.items():
        df = pd.concat(parts, ignore_index=True)
        if len(run_dirs) > 1 and "record_id" in df.columns:
            df["record_id"] = df["model"] + "|" + df["dataset"] + "|" + df["record_id"].astype(str)
            if "cluster_id" in df.columns:
                cid = df["cluster_id"].astype(object)
                df["cluster_id"] = np.where(missing_cluster(cid), None,
                                            df["model"] + "|" + df["dataset"] + "|" + cid.astype(str))
        tables[name] = df
    return tables, labels


def paired_settings_table(scores: pd.DataFrame, metric: str, treatment: str = "relay", reference: str = "original",
                          n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """The paper's Table 8: one row per setting (model, dataset, selector, budget; the label columns present) with
    the means under both conditions over the setting's valid pairs (the rows the difference uses: a pair whose
    judge failed on one side leaves both means), the paired difference ``delta`` = treatment - reference (so
    ``delta`` = treatment - reference of the printed means) and its 95% cluster-bootstrap interval, the counts,
    ``sign`` (``+``, ``-``, ``0``; ``""`` for a setting without a valid pair) and ``flag`` (a setting with fewer than
    :data:`~relaylens.reporting.bootstrap.MIN_CLUSTERS` clusters, or without a valid pair)."""
    by = [c for c in SETTING_COLUMNS if c in scores.columns]
    df = scores[(scores["metric"] == metric) & scores["condition"].isin([treatment, reference])]
    rows = []
    for group, g in df.groupby(by, sort=True):
        if set(g["condition"]) != {treatment, reference}:
            continue
        pairs, dropped = paired_values(g, None, treatment, reference)
        diff = (pairs[treatment] - pairs[reference]).to_numpy(dtype=np.float64)  # [pair]
        res = cluster_bootstrap(diff, pairs["_cluster"].to_numpy(), n_resamples, seed)
        sign = "" if not res.n else "+" if res.mean > 0 else "-" if res.mean < 0 else "0"
        rows.append(dict(zip(by, group if isinstance(group, tuple) else (group,))) | {
            "metric": metric, reference: float(pairs[reference].mean()), treatment: float(pairs[treatment].mean()),
            "delta": res.mean, "delta_low": res.low, "delta_high": res.high, "n_clusters": res.n_clusters,
            "n": res.n, "n_dropped": dropped, "sign": sign, "flag": few_clusters(res.n_clusters, res.n)})
    return pd.DataFrame(rows, columns=by + ["metric", reference, treatment, "delta", "delta_low", "delta_high",
                                            "n_clusters", "n", "n_dropped", "sign", "flag"])


def settings_count(table: pd.DataFrame) -> str:
    """``"N of M settings improve (P positive, Q negative, Z zero)"`` from :func:`paired_settings_table`, over the
    settings with a valid pair (the others are named, not counted), and how many rest on few clusters."""
    counted = table[table["sign"] != ""]
    pos, neg = int((counted["sign"] == "+").sum()), int((counted["sign"] == "-").sum())
    zero = int((counted["sign"] == "0").sum())
    text = f"{pos} of {len(counted)} settings improve ({pos} positive, {neg} negative, {zero} zero)"
    if len(counted) < len(table):
        text += f"; {len(table) - len(counted)} setting(s) without a valid pair not counted"
    few = int((counted["n_clusters"] < MIN_CLUSTERS).sum()) if "n_clusters" in counted else 0
    if few:
        text += f"; {few} setting(s) with fewer than {MIN_CLUSTERS} clusters (intervals unreliable)"
    return text
